"""``inagg switch serve``: the switch as a long-lived service (see :mod:`inagg.host.service`).

Only argparse is imported at module import time: ``inagg --help`` stays fast.
"""

from __future__ import annotations

import argparse
import sys

__all__ = ["register"]


def _address(text: str) -> tuple[str, int]:
    from inagg.host.service import parse_address

    try:
        return parse_address(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _int_in(lo: int, hi: int):
    def parse(text: str) -> int:
        try:
            x = int(text)
        except ValueError:
            x = None
        if x is None or not lo <= x <= hi:
            raise argparse.ArgumentTypeError(f"expected an integer in {lo}..{hi}, not {text!r}")
        return x
    return parse


def _rate(text: str) -> float:
    try:
        x = float(text)
    except ValueError:
        x = -1.0
    if not 0.0 <= x < 1.0:
        raise argparse.ArgumentTypeError(f"a rate is a number in [0, 1), not {text!r}")
    return x


# --ports and --slots when not given, by backend: a Verilator build grows with both.
_DEFAULTS = {"model": (64, 4096), "rtl": (4, 256)}
SERVICE_HOP_TIMEOUT = 0.05
"""The model switch's hop timeout (Modes I and III) behind the service, in seconds of real time."""


def _positive(kind: type):
    def parse(text: str):
        try:
            x = kind(text)
        except ValueError:
            x = None
        if x is None or not x > 0:
            raise argparse.ArgumentTypeError(f"expected a positive {kind.__name__}, not {text!r}")
        return x
    return parse


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``inagg switch serve`` to the command line."""
    import dataclasses

    from inagg.host.service import Limits
    from inagg.models.backend import DEFAULT_BACKEND, backend_names

    p = subparsers.add_parser("switch", help="run a switch for workers in other processes and machines",
                              description="Run an inagg switch as a service.")
    sub = p.add_subparsers(dest="switch_command", metavar="COMMAND", required=True)
    s = sub.add_parser(
        "serve", help="serve the switch over VXLAN, with a control endpoint for jobs",
        description="Serve the switch: workers reach it over VXLAN (UDP), the controller configures and tears "
                    "down jobs on the control endpoint (JSON lines over TCP, a token per job). SIGINT or "
                    "SIGTERM stop it gracefully.")
    s.add_argument("--listen", type=_address, required=True, metavar="HOST:PORT",
                   help="control endpoint (port 0: any free port; the log says which)")
    s.add_argument("--vxlan", type=_address, metavar="HOST:PORT",
                   help="VXLAN endpoint; port 0 takes any free one, which the log and every job ticket "
                        "carry (default: the --listen host, port 0; HOST:4789, the IANA port, lets tshark "
                        "decode captures without options but clashes with a kernel VXLAN device or a second "
                        "service)")
    s.add_argument("--vni", type=_int_in(0, (1 << 24) - 1), default=1, help="VXLAN network identifier (default 1)")
    s.add_argument("--backend", choices=backend_names(), default=DEFAULT_BACKEND,
                   help=f"the switch implementation: {DEFAULT_BACKEND} (default: the compiled software switch), "
                        "model (the reference numpy model), or rtl (the Verilated RTL in a simulator child process; "
                        "the first run of a geometry builds it: minutes)")
    s.add_argument("--ports", type=_int_in(1, 253),
                   help=f"switch ports: workers at once (default {_DEFAULTS['model'][0]}, "
                        f"{_DEFAULTS['rtl'][0]} with --backend rtl)")
    s.add_argument("--slots", type=_int_in(2, 1 << 20),
                   help=f"slots of the switch, a power of two (default {_DEFAULTS['model'][1]}, "
                        f"{_DEFAULTS['rtl'][1]} with --backend rtl)")
    s.add_argument("--width", type=int, choices=(64, 256, 512),
                   help="--backend rtl: beat width of the RTL in bits (default 64)")
    s.add_argument("--jobs", type=_int_in(2, 64),
                   help="--backend rtl: entries of the RTL's job table; jobs 1..N-1 can run at once (default 4)")
    s.add_argument("--hop-timeout", type=_positive(float), metavar="SECONDS",
                   help="--backend model: ACK timeout of a result on the hop in Modes I and III, in real time "
                        f"(default {SERVICE_HOP_TIMEOUT:g}: longer than a loaded host takes to ACK, shorter "
                        "than the hosts' own timeout)")
    s.add_argument("--chunk-bytes", type=int, default=1024, choices=(256, 512, 1024, 2048, 4096),
                   help="payload bytes per packet (default 1024)")
    for fault in ("loss", "dup", "reorder", "corrupt"):
        s.add_argument(f"--{fault}", type=_rate, default=0.0, help=f"{fault} rate of the link (default 0)")
    s.add_argument("--seed", type=int, default=0, help="seed of the link faults (default 0)")
    s.add_argument("--pcap", metavar="FILE", help="write every datagram in and out to FILE (pcap, Ethernet)")
    s.add_argument("--admin-token-file", metavar="FILE",
                   help="create_job must be signed with the token on FILE's first line (at least 16 characters; "
                        "clients read it from INAGG_ADMIN_TOKEN); without it anyone may create jobs, within quotas")
    s.add_argument("--tls-cert", metavar="FILE",
                   help="serve the control endpoint over TLS with this certificate (PEM, with its chain); clients "
                        "check it against the CA file in INAGG_TLS_CA (SwitchClient(tls_ca=))")
    s.add_argument("--tls-key", metavar="FILE", help="the private key of --tls-cert (PEM)")
    s.add_argument("--log-level", choices=("debug", "info", "warning", "error"), default="info",
                   help="log level (default info); logs go to stderr")
    limits = s.add_argument_group("limits of each control client (a source is an IP address)")
    for f in dataclasses.fields(Limits):
        limits.add_argument(f"--{f.name.replace('_', '-')}", type=_positive(type(f.default)), default=f.default,
                            metavar="N", help=f"{f.metadata['help']} (default {f.default})")
    s.set_defaults(func=_cmd_serve)


def _admin_token(path: str) -> str:
    """The admin token on the first line of file ``path``; ``ValueError`` when it cannot be read or is too short."""
    try:
        with open(path, encoding="utf-8") as f:
            token = f.readline().strip()
    except OSError as e:
        raise ValueError(f"cannot read the admin token: {e}") from None
    if len(token) < 16:
        raise ValueError(f"the admin token on the first line of {path} must have at least 16 characters")
    return token


def _tls(cert: str | None, key: str | None):
    """The control endpoint's TLS context for ``--tls-cert`` and ``--tls-key`` (None without them); ``ValueError``."""
    import ssl

    from inagg.host.service import tls_server_context

    if cert is None and key is None:
        return None
    if cert is None or key is None:
        raise ValueError("--tls-cert and --tls-key go together")
    try:
        return tls_server_context(cert, key)
    except (OSError, ssl.SSLError) as e:
        raise ValueError(f"cannot load the TLS certificate {cert} and key {key}: {e}") from None


def _cmd_serve(args: argparse.Namespace) -> int:
    import logging

    from inagg.models.job import SwitchSpec

    from inagg.host.link import Faults

    if args.backend != "rtl" and (args.width is not None or args.jobs is not None):
        print("inagg switch serve: error: --width and --jobs are options of --backend rtl", file=sys.stderr)
        return 2
    if args.backend != "model" and args.hop_timeout is not None:
        print("inagg switch serve: error: --hop-timeout is an option of --backend model", file=sys.stderr)
        return 2
    defaults = _DEFAULTS.get(args.backend, _DEFAULTS["model"])
    ports, slots = (given if given is not None else default
                    for given, default in zip((args.ports, args.slots), defaults))
    try:
        spec = SwitchSpec(ports=ports, slots=slots, chunk_bytes=args.chunk_bytes)
        faults = Faults(loss=args.loss, dup=args.dup, reorder=args.reorder, corrupt=args.corrupt)
        args.admin_token = None if args.admin_token_file is None else _admin_token(args.admin_token_file)
        args.tls = _tls(args.tls_cert, args.tls_key)
    except ValueError as e:
        print(f"inagg switch serve: error: {e}", file=sys.stderr)
        return 2
    # The service's logger only: a caller's own logging set-up stays as it is.
    logger = logging.getLogger("inagg.switch")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
    logger.addHandler(handler)
    logger.setLevel(args.log_level.upper())
    try:
        return _serve(args, spec, faults, logger)
    finally:
        logger.removeHandler(handler)


def _serve(args: argparse.Namespace, spec, faults, logger) -> int:
    import signal

    import dataclasses

    from inagg.host.service import Limits, SwitchService
    from inagg.host.vxlan import PcapWriter

    switch = _open_switch(args, spec, logger)
    if switch is None:
        return 1
    try:
        service = SwitchService(spec, control=args.listen, vxlan=args.vxlan or (args.listen[0], 0),
                                vni=args.vni, faults=faults, seed=args.seed, switch=switch,
                                limits=Limits(**{f.name: getattr(args, f.name) for f in dataclasses.fields(Limits)}),
                                admin_token=args.admin_token, tls=args.tls)
    except OSError as e:
        switch.close()
        print(f"inagg switch serve: error: cannot listen: {e}", file=sys.stderr)
        return 1
    if args.pcap:
        service.capture = PcapWriter(args.pcap)
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda signum, frame: service.shutdown())
    try:
        service.serve()
    finally:
        if service.capture is not None:
            service.capture.close()
    return 0 if service.failure is None else 1


def _open_switch(args: argparse.Namespace, spec, logger):
    """The registered backend ``args.backend`` opened for ``spec``; None (the reason printed) when it cannot start."""
    from inagg.models.backend import MissingTool, SwitchBackendError, load_backend

    rtl = args.backend == "rtl"
    options = {"width": args.width or 64, "jobs": args.jobs or 4} if rtl else {}
    if args.backend == "model":
        options["hop_timeout"] = args.hop_timeout or SERVICE_HOP_TIMEOUT
    if rtl:
        logger.info("starting the RTL switch: %d ports, %d-bit beats, %d slots, %d jobs (a new geometry is built "
                    "first: minutes)", spec.ports, options["width"], spec.slots, options["jobs"])
    try:
        backend = load_backend(args.backend)
    except ImportError as e:
        print(f"inagg switch serve: error: --backend {args.backend} needs the simulation tools "
              f"(pip install 'inagg[dev]'): {e}", file=sys.stderr)
        return None
    try:
        switch = backend.open(spec, **options)
    except (MissingTool, ValueError) as e:
        print(f"inagg switch serve: error: {e}", file=sys.stderr)
        return None
    except SwitchBackendError as e:
        print(f"inagg switch serve: error: the {'RTL' if rtl else backend.name} switch did not start: {e}",
              file=sys.stderr)
        return None
    if rtl:
        logger.info("RTL switch running: simulator pid %d, build %s", switch.pid, switch.build_dir)
    return switch
