/* inagg Mode II aggregation switch for Tofino (TNA): Tofino 1, and Tofino 2
 * when compiled with __TARGET_TOFINO__ == 2 (p4c-barefoot --target tofino2).
 *
 * The P4 profile of docs/protocol.md section 8 with the Tofino limits of
 * inagg.models.p4profile.TNA: chunks of 256 bytes (64 lanes), at most 32
 * workers per job, no ICRC check (results carry an ICRC field of zero; see
 * docs/p4.md), sticky saturating INT32 lanes and ImmDt bit 30 (SATURATED).
 *
 * A contribution crosses the ingress pipeline up to four times, always
 * through the pipe's recirculation port (one port, so the passes of all
 * contributions keep their order):
 *   pass 0  frame checks and the slot rules (slot_key, slot_state, slot_bitmap);
 *   pass 1  32 lanes into the 32 lane registers at entry 2 * slot;
 *   pass 2  the other 32 lanes at entry 2 * slot + 1;
 *   pass 3  only for the contribution that completes the chunk and for a
 *           resend: the parser flags pinned lanes (SATURATED) while it reads
 *           the 64 result lanes, the slot becomes DONE, and the result is
 *           multicast (or sent to the one worker).
 * The slot rules take one pass of their own because each step reads the
 * previous step's register output, and a Tofino 1 stage has four stateful
 * ALUs: the 32 lane registers fill eight stages, which the slot rules would
 * otherwise delay past the twelfth. The egress reads no lane: it rewrites
 * the headers up to the RETH, adds ImmDt, and leaves lanes and ICRC as
 * payload (Tofino 1's egress parser reads at most 160 bytes).
 *
 * Table, register and counter names are the control plane's
 * (inagg.host.p4ctl.bfrt): change them together. */

#include <core.p4>
#if __TARGET_TOFINO__ == 2
#include <t2na.p4>
#else
#include <tna.p4>
#endif

#include "../common/protocol.p4"

#ifndef INAGG_SLOTS
#define INAGG_SLOTS 4096
#endif
#ifndef INAGG_RECIRC_PORT
#if __TARGET_TOFINO__ == 2
#define INAGG_RECIRC_PORT 6    /* pipe 0's recirculation port on Tofino 2 */
#else
#define INAGG_RECIRC_PORT 68   /* pipe 0's recirculation port on Tofino 1 */
#endif
#endif

const bit<32> CHUNK_BYTES = 256;
const bit<16> CONTRIB_TOTAL = 20 + 8 + 12 + 16 + 256 + 4;
const bit<32> PSN_ENTRIES = 1024 * 32;  /* one per (job, worker index) */

/* Verdicts of the slot rules (docs/protocol.md section 3). */
const bit<3> V_FIRST = 1;   /* the slot (re)starts with this chunk */
const bit<3> V_SAME = 2;    /* the slot holds this chunk, still aggregating */
const bit<3> V_DONE = 3;    /* the slot holds this chunk, complete */
const bit<3> V_STALE = 4;
const bit<3> V_WINDOW = 5;
/* A first generation meets another chunk: restarts (protocol.md "Liveness").
 * Two verdicts, 0b11x (verdict[2:1] == 3 is either), by the sign of
 * chunk - key: if the slot's chunk turns out complete, the newcomer is
 * dropped as stale or as ahead, and no gateway could test that sign under
 * the two conditions it already reads. */
const bit<3> V_RESTART = 6;        /* the newcomer is ahead of the slot's chunk */
const bit<3> V_RESTART_BEHIND = 7; /* the newcomer is behind it */

/* What pass 0 decided, for the lane passes and the egress. */
const bit<8> OP_ADD = 0;
const bit<8> OP_FIRST = 1;
const bit<8> OP_RESEND = 2;

/* Every field a whole byte or more: fields that share a PHV container must
 * not be written from different sources in one action. */
header bridge_h {
    bit<8>  result;     /* 1: a result on its way to a worker; 0: to the next pass */
    bit<8>  pass;       /* the pass this frame takes next: 1, 2 or 3 */
    bit<8>  op;
    bit<8>  complete;   /* this contribution completed the chunk */
    bit<8>  saturated;  /* a result lane is pinned (set in pass 3) */
    bit<8>  worker;
    bit<16> job;
    bit<16> port;       /* the contributing worker's port, for a resend */
    bit<16> mcast_grp;  /* the job's group, for a completed chunk */
    bit<32> slot;
    bit<32> lane_index; /* the lane registers' entry in this lane pass */
    bit<32> chunk;
    bit<32> next_chunk; /* chunk + R: the slot key once the slot is DONE */
    bit<32> ring_offset;  /* (chunk mod R) * C: the result's offset in the ring */
}

/* The payload as two halves of 32 lanes. The ingress deparser emits `hi`
 * before `lo`, so the halves change places on every pass: pass 1 finds the
 * frame's lanes 32-63 in `lo`, pass 2 its lanes 0-31, and pass 3 sees the
 * frame's own order again. Each lane register thus reads one PHV field in
 * both lane passes (a Tofino 1 stateful ALU takes one 32-bit PHV input), and
 * no metadata copy of the lanes is needed. */
struct ig_headers_t {
    bridge_h bridge;
    ethernet_h eth;
    ipv4_h ipv4;
    udp_h udp;
    bth_h bth;
    reth_h reth;
    lane_h[32] lo;
    lane_h[32] hi;
    icrc_h icrc;
}

struct eg_headers_t {
    bridge_h bridge;
    ethernet_h eth;
    ipv4_h ipv4;
    udp_h udp;
    bth_h bth;
    reth_h reth;
    immdt_h immdt;
}

/* slot_key: `chunk` is the chunk the slot holds while FREE or aggregating,
 * and that chunk + R once it is DONE, which is the one chunk allowed to
 * restart it. `used` is 0 while the slot is FREE, USED_FIRST until it first
 * completes (protocol.md "Liveness": until then any other chunk restarts
 * it) and USED_DONE from then on. USED_FIRST's bit is set in both, so the
 * claim sets `used` with one OR and takes two comparisons (a Tofino 1
 * stateful ALU has two). */
struct slot_key_t {
    bit<32> used;
    bit<32> chunk;
}
const bit<32> USED_FIRST = 1;
const bit<32> USED_DONE = 3;

/* slot_state holds SLOT_FREE, SLOT_DONE, or while the slot aggregates
 * ST_AGG, or ST_AGG_FIRST in its first generation: the verdict needs the
 * first bit too. ST_AGG is SLOT_DONE with bit 0 set, so the claim of a slot
 * that holds this chunk is one OR with 1, which turns DONE (the next
 * generation) into ST_AGG and leaves either aggregating value as it is. */
const bit<32> ST_AGG = 3;
const bit<32> ST_AGG_FIRST = 7;

struct ig_metadata_t {
    bool    csum_err;
    bit<1>  saturated;    /* the parser saw a pinned lane */
    bit<1>  counted;      /* this pass counts meta.event */
    bit<1>  accept;
    bit<1>  known;        /* the workers table knows the QPN */
    bit<10> job;
    bit<6>  worker;
    bit<32> rkey;
    bit<32> slot_base;
    bit<32> slot_mask;
    bit<32> wbit;
    bit<32> full;
    bit<9>  worker_port;
    bit<16> mcast_grp;
    bit<32> event;
    bit<32> chunk;
    bit<32> region;       /* R */
    bit<32> offset;       /* chunk mod R */
    bit<32> slot;
    bit<32> key_in;       /* slot_key's input: the chunk (pass 0), chunk + R (pass 3) */
    bit<32> key;          /* slot_key.chunk before this contribution */
    bit<32> d;            /* chunk - key */
    bit<32> d_done;       /* chunk - (key - R): 0 for a resend of a DONE chunk */
    bit<32> next_chunk;   /* chunk + R */
    bit<32> ring_offset;
    bit<32> state;        /* slot_state before this contribution */
    bit<3>  verdict;
    bit<32> old_bitmap;
    bit<32> dup;
    bit<32> joined;
    bit<32> dma_pad;      /* RETH DMA length + BTH PadCnt */
    bit<32> missing;      /* full ^ joined: 0 when this contribution completes the chunk */
}

struct eg_metadata_t {
}

/* The lane states of the ingress parser, one chain per half, unrolled by
 * hand: each lane takes three rows of the parser's TCAM (INT32_MIN,
 * INT32_MAX, any other value), 206 rows in all of Tofino 1's 256. A loop on
 * a ParserCounter costs two more rows a lane for the counter's test, 339
 * in all, which the assembler refuses. A constant stack index per state:
 * with .next the compiler leaves hdr.hi without PHV containers. */
#define INAGG_TNA_LANE_STATE(h, n, then) \
    state h##_##n { \
        transition select(pkt.lookahead<bit<32>>()) { \
            I32_MIN: h##_pin_##n; \
            I32_MAX: h##_pin_##n; \
            default: h##_take_##n; \
        } \
    } \
    state h##_pin_##n { \
        meta.saturated = 1; \
        transition h##_take_##n; \
    } \
    state h##_take_##n { \
        pkt.extract(hdr.h[n]); \
        transition then; \
    }
#define INAGG_TNA_LANE_CHAIN(h, after) \
    INAGG_TNA_LANE_STATE(h, 0, h##_1) INAGG_TNA_LANE_STATE(h, 1, h##_2) \
    INAGG_TNA_LANE_STATE(h, 2, h##_3) INAGG_TNA_LANE_STATE(h, 3, h##_4) \
    INAGG_TNA_LANE_STATE(h, 4, h##_5) INAGG_TNA_LANE_STATE(h, 5, h##_6) \
    INAGG_TNA_LANE_STATE(h, 6, h##_7) INAGG_TNA_LANE_STATE(h, 7, h##_8) \
    INAGG_TNA_LANE_STATE(h, 8, h##_9) INAGG_TNA_LANE_STATE(h, 9, h##_10) \
    INAGG_TNA_LANE_STATE(h, 10, h##_11) INAGG_TNA_LANE_STATE(h, 11, h##_12) \
    INAGG_TNA_LANE_STATE(h, 12, h##_13) INAGG_TNA_LANE_STATE(h, 13, h##_14) \
    INAGG_TNA_LANE_STATE(h, 14, h##_15) INAGG_TNA_LANE_STATE(h, 15, h##_16) \
    INAGG_TNA_LANE_STATE(h, 16, h##_17) INAGG_TNA_LANE_STATE(h, 17, h##_18) \
    INAGG_TNA_LANE_STATE(h, 18, h##_19) INAGG_TNA_LANE_STATE(h, 19, h##_20) \
    INAGG_TNA_LANE_STATE(h, 20, h##_21) INAGG_TNA_LANE_STATE(h, 21, h##_22) \
    INAGG_TNA_LANE_STATE(h, 22, h##_23) INAGG_TNA_LANE_STATE(h, 23, h##_24) \
    INAGG_TNA_LANE_STATE(h, 24, h##_25) INAGG_TNA_LANE_STATE(h, 25, h##_26) \
    INAGG_TNA_LANE_STATE(h, 26, h##_27) INAGG_TNA_LANE_STATE(h, 27, h##_28) \
    INAGG_TNA_LANE_STATE(h, 28, h##_29) INAGG_TNA_LANE_STATE(h, 29, h##_30) \
    INAGG_TNA_LANE_STATE(h, 30, h##_31) INAGG_TNA_LANE_STATE(h, 31, after)

parser InaggIngressParser(packet_in pkt, out ig_headers_t hdr, out ig_metadata_t meta,
                          out ingress_intrinsic_metadata_t ig_intr_md) {
    Checksum() ipv4_csum;

    state start {
        pkt.extract(ig_intr_md);
        pkt.advance(PORT_METADATA_SIZE);
        meta.csum_err = false;
        meta.saturated = 0;
        transition select(ig_intr_md.ingress_port) {
            INAGG_RECIRC_PORT: parse_bridge;
            default: parse_eth;
        }
    }
    state parse_bridge {
        pkt.extract(hdr.bridge);
        transition parse_eth;
    }
    state parse_eth {
        pkt.extract(hdr.eth);
        transition select(hdr.eth.ether_type) {
            ETHERTYPE_IPV4: parse_ipv4;
            default: accept;
        }
    }
    state parse_ipv4 {
        pkt.extract(hdr.ipv4);
        ipv4_csum.add(hdr.ipv4);
        meta.csum_err = ipv4_csum.verify();
        transition select(hdr.ipv4.protocol) {
            IP_PROTO_UDP: parse_udp;
            default: accept;
        }
    }
    state parse_udp {
        pkt.extract(hdr.udp);
        transition select(hdr.udp.dport) {
            ROCE_UDP_PORT: parse_roce;
            default: accept;
        }
    }
    /* One layout: a shorter frame ends in PARTIAL_HDR, counted as a bad length. */
    state parse_roce {
        pkt.extract(hdr.bth);
        pkt.extract(hdr.reth);
        transition lo_0;
    }
    /* SATURATED: a lane at INT32_MIN or INT32_MAX (inagg.models.p4profile).
     * Flagged on every pass; only pass 3, which reads the 64 result lanes,
     * uses the flag. */
    INAGG_TNA_LANE_CHAIN(lo, hi_0)
    INAGG_TNA_LANE_CHAIN(hi, parse_icrc)
    state parse_icrc {
        pkt.extract(hdr.icrc);
        transition accept;
    }
}

/* Lane register i holds, per slot, the frame's lane 32 + i at entry 2 * slot
 * (pass 1) and its lane i at entry 2 * slot + 1 (pass 2). */
#define INAGG_TNA_LANE_DECL(i) \
    Register<bit<32>, bit<32>>(2 * INAGG_SLOTS) lane_##i; \
    RegisterAction<bit<32>, bit<32>, bit<32>>(lane_##i) lane_add_##i = { \
        void apply(inout bit<32> v, out bit<32> rv) { \
            if (v != I32_MIN && v != I32_MAX) { \
                v = (bit<32>)((int<32>)v |+| (int<32>)hdr.lo[0 + i].v); \
            } \
            rv = v; \
        } \
    }; \
    RegisterAction<bit<32>, bit<32>, bit<32>>(lane_##i) lane_store_##i = { \
        void apply(inout bit<32> v) { \
            v = hdr.lo[0 + i].v; \
        } \
    }; \
    RegisterAction<bit<32>, bit<32>, bit<32>>(lane_##i) lane_read_##i = { \
        void apply(inout bit<32> v, out bit<32> rv) { \
            rv = v; \
        } \
    }; \
    action lane_do_add_##i() { hdr.lo[0 + i].v = lane_add_##i.execute(hdr.bridge.lane_index); } \
    action lane_do_store_##i() { lane_store_##i.execute(hdr.bridge.lane_index); } \
    action lane_do_read_##i() { hdr.lo[0 + i].v = lane_read_##i.execute(hdr.bridge.lane_index); } \
    table lane_op_##i { \
        key = { hdr.bridge.op : exact; } \
        actions = { lane_do_add_##i; lane_do_store_##i; lane_do_read_##i; } \
        const entries = { \
            OP_ADD : lane_do_add_##i(); OP_FIRST : lane_do_store_##i(); OP_RESEND : lane_do_read_##i(); \
        } \
        size = 3; \
    }

/* A stored lane is already in the frame; an added or resent one comes from
 * the register. One table per lane picks the register action by the op: an
 * if-else would cost a table per action, three per lane, and the 12 stages'
 * 192 logical tables cannot hold 96 lane tables beside pass 0's chain. Every
 * op has its entry: a default action cannot index a register (it has no
 * hash distribution unit), and pass 0 sets no other op. */
#define INAGG_TNA_LANE_APPLY(i) lane_op_##i.apply();

control InaggIngress(inout ig_headers_t hdr, inout ig_metadata_t meta,
                     in ingress_intrinsic_metadata_t ig_intr_md,
                     in ingress_intrinsic_metadata_from_parser_t ig_prsr_md,
                     inout ingress_intrinsic_metadata_for_deparser_t ig_dprsr_md,
                     inout ingress_intrinsic_metadata_for_tm_t ig_tm_md) {
    /* A Tofino counter counts once per pass and lives in one stage: pass 0
     * and pass 3 each count exactly one event, from one call site. */
    Counter<bit<32>, bit<1>>(1, CounterType_t.PACKETS) rx_frames;
    Counter<bit<32>, bit<32>>(N_COUNTERS, CounterType_t.PACKETS) ingress_events;
    Counter<bit<32>, bit<1>>(1, CounterType_t.PACKETS) promoted;

    Register<slot_key_t, bit<32>>(INAGG_SLOTS) slot_key;
    /* slot_base | offset: their bits do not overlap, so an XOR hash unit
     * forms the register index (an ALU OR feeding the index is refused). */
    Hash<bit<32>>(HashAlgorithm_t.XOR32) slot_index;
    Register<bit<32>, bit<32>>(INAGG_SLOTS) slot_state;
    Register<bit<32>, bit<32>>(INAGG_SLOTS) slot_bitmap;

    /* Claims a FREE slot, restarts a first generation with any chunk and a
     * DONE one for chunk + R, and leaves any other as it is (rewriting a
     * slot that holds this chunk changes nothing). */
    RegisterAction<slot_key_t, bit<32>, bit<32>>(slot_key) key_claim = {
        void apply(inout slot_key_t v, out bit<32> rv) {
            rv = v.chunk;
            if (v.used != USED_DONE || v.chunk == meta.key_in) {
                v.chunk = meta.key_in;
            }
            v.used = v.used | USED_FIRST;
        }
    };
    RegisterAction<slot_key_t, bit<32>, bit<32>>(slot_key) key_done = {
        void apply(inout slot_key_t v) {
            v.chunk = meta.key_in;
            v.used = USED_DONE;
        }
    };
    /* The same claim for the state: FREE, or a key that matched (d == 0).
     * A first generation that restarts stays ST_AGG_FIRST. */
    RegisterAction<bit<32>, bit<32>, bit<32>>(slot_state) state_enter = {
        void apply(inout bit<32> v, out bit<32> rv) {
            rv = v;
            if (v == (bit<32>)SLOT_FREE) {
                v = ST_AGG_FIRST;
            } else if (meta.d == 0) {
                v = v | 1;
            }
        }
    };
    RegisterAction<bit<32>, bit<32>, bit<32>>(slot_state) state_done = {
        void apply(inout bit<32> v) {
            v = (bit<32>)SLOT_DONE;
        }
    };
    RegisterAction<bit<32>, bit<32>, bit<32>>(slot_bitmap) bitmap_start = {
        void apply(inout bit<32> v) {
            v = meta.wbit;
        }
    };
    /* A restart keeps a complete bitmap: its chunk completed in this
     * pass 0 or an earlier one, and its pass 3 (which makes the slot DONE
     * and reads the lanes) is still on its way, so nothing of this
     * contribution may enter the slot. No frame can find a first
     * generation complete after that pass 3. It returns the complete
     * bitmap, never 0 (a job has a worker), or 0 where the slot restarts:
     * the other chunk's workers are gone with it. A SALU output is
     * predicated, 0 where it is not written, so the pass needs no stage
     * to test the old bitmap against the full one. */
    RegisterAction<bit<32>, bit<32>, bit<32>>(slot_bitmap) bitmap_restart = {
        void apply(inout bit<32> v, out bit<32> rv) {
            if (v == meta.full) {
                rv = v;
            } else {
                v = meta.wbit;
            }
        }
    };
    RegisterAction<bit<32>, bit<32>, bit<32>>(slot_bitmap) bitmap_join = {
        void apply(inout bit<32> v, out bit<32> rv) {
            rv = v;
            v = v | meta.wbit;
        }
    };

    INAGG_LANES_32(INAGG_TNA_LANE_DECL)

    /* A Tofino action takes one stage, so sums of sums are separate actions. */
    action slot_sums() {
        meta.d_done = meta.d + meta.region;
        meta.next_chunk = meta.chunk + meta.region;
        meta.ring_offset = meta.offset << 8;
    }

    /* The slot rules' verdict from the state before this contribution and
     * the two key differences (docs/protocol.md section 3): a gateway could
     * not read the state and a 32-bit difference and another at once, a
     * ternary table reads all three; the first matching entry decides. */
    action set_verdict(bit<3> v) {
        meta.verdict = v;
    }
    table slot_verdict {
        key = {
            meta.state[2:0] : ternary;
            meta.d          : ternary;
            meta.d_done     : ternary;
        }
        actions = { set_verdict; }
        const entries = {
            ((bit<3>)SLOT_FREE, _, _)                         : set_verdict(V_FIRST);
            ((bit<3>)ST_AGG_FIRST, 0, _)                      : set_verdict(V_SAME);
            ((bit<3>)ST_AGG_FIRST, 0x80000000 &&& 0x80000000, _) : set_verdict(V_RESTART_BEHIND);
            ((bit<3>)ST_AGG_FIRST, _, _)                      : set_verdict(V_RESTART);
            ((bit<3>)SLOT_DONE, 0, _)                         : set_verdict(V_FIRST);  /* chunk + R */
            ((bit<3>)ST_AGG, 0, _)                            : set_verdict(V_SAME);
            ((bit<3>)SLOT_DONE, _, 0)                         : set_verdict(V_DONE);   /* a resend */
            ((bit<3>)ST_AGG, 0x80000000 &&& 0x80000000, _)    : set_verdict(V_STALE);
            ((bit<3>)SLOT_DONE, _, 0x80000000 &&& 0x80000000) : set_verdict(V_STALE);
        }
        const default_action = set_verdict(V_WINDOW);
        size = 9;
    }

    /* DMA length = C - PadCnt (- 4 with ImmDt) as one sum, in a field the
     * gateways read in halves. */
    action length_sums() {
        meta.dma_pad = hdr.reth.dma_len + (bit<32>)hdr.bth.pad;
    }

    /* Each a stage of its own: the gateways then read plain fields, one
     * 32-bit field each, not the expressions. */
    action bitmap_sums() {
        meta.dup = meta.old_bitmap & meta.wbit;
        meta.joined = meta.old_bitmap | meta.wbit;
    }
    action bitmap_missing() {
        meta.missing = meta.full ^ meta.joined;
    }

    bit<16> pkey = 0xFFFF;
    action set_switch(bit<16> p) {
        pkey = p;
    }
    table switch_config {
        actions = { set_switch; }
        default_action = set_switch(0xFFFF);
    }

    action set_worker(bit<10> job, bit<6> worker, bit<32> rkey, bit<32> slot_base,
                      bit<32> slot_mask, bit<32> wbit, bit<32> full, bit<9> port,
                      bit<16> mcast_grp) {
        meta.known = 1;
        meta.job = job;
        meta.worker = worker;
        meta.rkey = rkey;
        meta.slot_base = slot_base;
        meta.slot_mask = slot_mask;
        meta.wbit = wbit;
        meta.full = full;
        meta.worker_port = port;
        meta.mcast_grp = mcast_grp;
    }
    action unknown_qpn() {
        meta.known = 0;
    }
    table workers {
        key = { hdr.bth.dqpn: exact; }
        actions = { set_worker; unknown_qpn; }
        const default_action = unknown_qpn();
        size = 32768;
    }

    apply {
        meta.counted = 0;
        meta.accept = 0;
        if (!hdr.bridge.isValid()) {
            /* Pass 0: the frame checks in the order of docs/protocol.md
             * section 5 (check 9, the ICRC, is not possible on Tofino), then
             * the slot rules of section 3. The lookups and sums the checks
             * need run first, side by side, so that the slot rules start in
             * stage 3. */
            rx_frames.count(0);
            meta.counted = 1;
            meta.event = CNT_RX_CONTRIB;
            switch_config.apply();
            workers.apply();
            length_sums();
            if (!hdr.eth.isValid()) {
                meta.event = CNT_DROP_BAD_LENGTH;
            } else if (hdr.eth.ether_type != ETHERTYPE_IPV4) {
                meta.event = CNT_DROP_NON_ROCE;
            } else if (!hdr.ipv4.isValid()) {
                meta.event = CNT_DROP_BAD_LENGTH;
            } else if (hdr.ipv4.version != 4 || hdr.ipv4.ihl != 5 || hdr.ipv4.flag_mf == 1
                    || hdr.ipv4.frag_offset != 0 || meta.csum_err) {
                meta.event = CNT_DROP_BAD_HEADER;
            } else if (hdr.ipv4.flag_rsvd == 1) {
                meta.event = CNT_DROP_BAD_HEADER;
            } else if (hdr.ipv4.protocol != IP_PROTO_UDP) {
                meta.event = CNT_DROP_NON_ROCE;
            /* A gateway takes 4 bytes + 12 bits of PHV: an OR of tests on
             * different fields is written as branches with the same event. */
            } else if (!hdr.udp.isValid()) {
                meta.event = CNT_DROP_BAD_LENGTH;
            /* total_len < 28, as masked compares (a gateway has no 16-bit
             * range compare to spare): 0..27 are the values below 32 whose
             * bits 4:2 are not all ones. */
            } else if ((hdr.ipv4.total_len & 0xFFE0) == 0 && (hdr.ipv4.total_len & 0x1C) != 0x1C) {
                meta.event = CNT_DROP_BAD_LENGTH;
            } else if (hdr.udp.dport != ROCE_UDP_PORT) {
                meta.event = CNT_DROP_NON_ROCE;
            } else if ((ig_prsr_md.parser_err & PARSER_ERROR_PARTIAL_HDR) != 0) {
                meta.event = CNT_DROP_BAD_LENGTH;
            /* "UDP length != IP payload or IP length != the layout's" holds
             * exactly when one of the two differs from the layout's own
             * value: two compares with constants instead of one of two fields. */
            } else if (hdr.ipv4.total_len != CONTRIB_TOTAL) {
                meta.event = CNT_DROP_BAD_LENGTH;
            } else if (hdr.udp.len != CONTRIB_TOTAL - IPV4_LEN) {
                meta.event = CNT_DROP_BAD_LENGTH;
            } else if (hdr.bth.tver != 0) {
                meta.event = CNT_DROP_BAD_HEADER;
            } else if (hdr.bth.pkey != pkey) {
                meta.event = CNT_DROP_BAD_HEADER;
            /* The RC and UC opcodes of a WRITE differ in bit 5 only; the
             * 32-bit DMA length sum is tested as two 16-bit halves, so each
             * gateway reads the opcode byte and 2 bytes of the sum. */
            } else if ((hdr.bth.opcode & 0xDF) == OP_RC_WRITE_ONLY && meta.dma_pad[31:16] != 0) {
                meta.event = CNT_DROP_BAD_LENGTH;
            } else if ((hdr.bth.opcode & 0xDF) == OP_RC_WRITE_ONLY && meta.dma_pad[15:0] != (bit<16>)CHUNK_BYTES) {
                meta.event = CNT_DROP_BAD_LENGTH;
            } else if ((hdr.bth.opcode & 0xDF) == OP_RC_WRITE_ONLY_IMM && meta.dma_pad[31:16] != 0) {
                meta.event = CNT_DROP_BAD_LENGTH;
            } else if ((hdr.bth.opcode & 0xDF) == OP_RC_WRITE_ONLY_IMM
                    && meta.dma_pad[15:0] != (bit<16>)CHUNK_BYTES - IMMDT_LEN) {
                meta.event = CNT_DROP_BAD_LENGTH;
            } else if (hdr.bth.opcode != OP_UC_WRITE_ONLY) {
                meta.event = CNT_DROP_BAD_OPCODE;
            } else if (hdr.reth.dma_len != CHUNK_BYTES || hdr.bth.pad != 0) {
                meta.event = CNT_DROP_BAD_LENGTH;
            } else if (meta.known == 0) {
                meta.event = CNT_DROP_UNKNOWN_QPN;
            /* Check 14: on another port than its own the QPN names no worker. */
            } else if (ig_intr_md.ingress_port != meta.worker_port) {
                meta.event = CNT_DROP_UNKNOWN_QPN;
            } else if (hdr.reth.rkey != meta.rkey) {
                meta.event = CNT_DROP_BAD_RKEY;
            } else if (hdr.reth.va[7:0] != 0 || hdr.reth.va[63:40] != 0) {
                meta.event = CNT_DROP_BAD_ADDRESS;
            } else {
                /* Slot rules. Each step reads the previous one's result, so
                 * the steps take consecutive stages. */
                meta.chunk = hdr.reth.va[39:8];
                meta.region = meta.slot_mask + 1;
                meta.offset = meta.chunk & meta.slot_mask;
                meta.slot = slot_index.get({meta.slot_base, meta.offset});
                meta.key_in = meta.chunk;
                meta.key = key_claim.execute(meta.slot);
                meta.d = meta.chunk - meta.key;
                slot_sums();
                meta.state = state_enter.execute(meta.slot);
                slot_verdict.apply();
                if (meta.verdict == V_FIRST) {
                    meta.old_bitmap = 0;
                    bitmap_start.execute(meta.slot);
                } else if (meta.verdict[2:1] == 3) {   /* either restart */
                    meta.old_bitmap = bitmap_restart.execute(meta.slot);
                } else if (meta.verdict == V_SAME || meta.verdict == V_DONE) {
                    meta.old_bitmap = bitmap_join.execute(meta.slot);
                }
                /* For every verdict (those that drop ignore them), so that no
                 * stage after the tests computes them. */
                bitmap_sums();
                bitmap_missing();
                if (meta.verdict == V_STALE) {
                    meta.event = CNT_DROP_STALE;
                } else if (meta.verdict == V_WINDOW) {
                    meta.event = CNT_DROP_WINDOW;
                /* The slot's chunk is complete, its pass 3 on the way
                 * (bitmap_restart): the model, which completes at once, finds
                 * the slot DONE and drops this chunk as stale or too far
                 * ahead. */
                } else if (meta.verdict == V_RESTART_BEHIND && meta.old_bitmap != 0) {
                    meta.event = CNT_DROP_STALE;
                } else if (meta.verdict == V_RESTART && meta.old_bitmap != 0) {
                    meta.event = CNT_DROP_WINDOW;
                } else {
                    hdr.bridge.setValid();
                    hdr.bridge.result = 0;
                    hdr.bridge.pass = 1;
                    hdr.bridge.saturated = 0;
                    hdr.bridge.worker = (bit<8>)meta.worker;
                    hdr.bridge.job = (bit<16>)meta.job;
                    hdr.bridge.port = (bit<16>)meta.worker_port;
                    hdr.bridge.mcast_grp = meta.mcast_grp;
                    hdr.bridge.slot = meta.slot;
                    hdr.bridge.lane_index = meta.slot << 1;
                    hdr.bridge.chunk = meta.chunk;
                    hdr.bridge.next_chunk = meta.next_chunk;
                    hdr.bridge.ring_offset = meta.ring_offset;
                    if (meta.missing == 0) {
                        hdr.bridge.complete = 1;
                    } else {
                        hdr.bridge.complete = 0;
                    }
                    if (meta.dup != 0) {
                        meta.event = CNT_DUP_CONTRIB;
                        if (meta.verdict == V_DONE) {
                            meta.accept = 1;
                            hdr.bridge.op = OP_RESEND;
                        }
                    } else {
                        meta.accept = 1;
                        if (meta.verdict == V_FIRST || meta.verdict[2:1] == 3) {
                            hdr.bridge.op = OP_FIRST;
                        } else {
                            hdr.bridge.op = OP_ADD;
                        }
                    }
                }
            }
            if (meta.accept == 1) {
                ig_tm_md.ucast_egress_port = INAGG_RECIRC_PORT;
            } else {
                ig_dprsr_md.drop_ctl = 1;
            }
        } else if (hdr.bridge.pass == 1 || hdr.bridge.pass == 2) {
            INAGG_LANES_32(INAGG_TNA_LANE_APPLY)
            hdr.bridge.lane_index = hdr.bridge.lane_index | 1;   /* 2 * slot + 1 for pass 2 */
            if (hdr.bridge.pass == 1 || hdr.bridge.op == OP_RESEND || hdr.bridge.complete == 1) {
                hdr.bridge.pass = hdr.bridge.pass + 1;
                ig_tm_md.ucast_egress_port = INAGG_RECIRC_PORT;
            } else {
                ig_dprsr_md.drop_ctl = 1;   /* added; the chunk is not complete yet */
            }
        } else {
            /* Pass 3: the result. The parser read the 64 result lanes. */
            meta.counted = 1;
            hdr.bridge.result = 1;
            hdr.bridge.saturated = (bit<8>)meta.saturated;
            /* No ICRC engine covers the frame: the field is zero, never stale (docs/p4.md). */
            hdr.icrc.wire = 0;
            if (hdr.bridge.op == OP_RESEND) {
                meta.event = CNT_TX_RESENDS;
                ig_tm_md.ucast_egress_port = (PortId_t)hdr.bridge.port;
            } else {
                meta.event = CNT_COMPLETED;
                meta.slot = hdr.bridge.slot;
                meta.key_in = hdr.bridge.next_chunk;
                key_done.execute(meta.slot);
                state_done.execute(meta.slot);
                if (meta.saturated == 1) {
                    promoted.count(0);
                }
                ig_tm_md.mcast_grp_a = hdr.bridge.mcast_grp;
            }
        }
        if (meta.counted == 1) {
            ingress_events.count(meta.event);
        }
    }
}

control InaggIngressDeparser(packet_out pkt, inout ig_headers_t hdr, in ig_metadata_t meta,
                             in ingress_intrinsic_metadata_for_deparser_t ig_dprsr_md) {
    apply {
        pkt.emit(hdr.bridge);
        pkt.emit(hdr.eth);
        pkt.emit(hdr.ipv4);
        pkt.emit(hdr.udp);
        pkt.emit(hdr.bth);
        pkt.emit(hdr.reth);
        pkt.emit(hdr.hi);   /* the halves change places: see ig_headers_t */
        pkt.emit(hdr.lo);
        pkt.emit(hdr.icrc);
    }
}

parser InaggEgressParser(packet_in pkt, out eg_headers_t hdr, out eg_metadata_t meta,
                         out egress_intrinsic_metadata_t eg_intr_md) {
    state start {
        pkt.extract(eg_intr_md);
        pkt.extract(hdr.bridge);
        transition select(hdr.bridge.result) {
            1: parse_result;
            default: accept;   /* on its way to the next pass: left as it is */
        }
    }
    state parse_result {
        pkt.extract(hdr.eth);
        pkt.extract(hdr.ipv4);
        pkt.extract(hdr.udp);
        pkt.extract(hdr.bth);
        pkt.extract(hdr.reth);
        transition accept;
    }
}

control InaggEgress(inout eg_headers_t hdr, inout eg_metadata_t meta,
                    in egress_intrinsic_metadata_t eg_intr_md,
                    in egress_intrinsic_metadata_from_parser_t eg_prsr_md,
                    inout egress_intrinsic_metadata_for_deparser_t eg_dprsr_md,
                    inout egress_intrinsic_metadata_for_output_port_t eg_oport_md) {
    Counter<bit<32>, bit<1>>(1, CounterType_t.PACKETS) tx_results;
    /* The register keeps counting past 24 bits; the BTH takes the low 24
     * (one operator per statement in a stateful ALU). */
    Register<bit<32>, bit<32>>(PSN_ENTRIES) result_psn;
    RegisterAction<bit<32>, bit<32>, bit<32>>(result_psn) next_psn = {
        void apply(inout bit<32> v, out bit<32> rv) {
            rv = v;
            v = v + 1;
        }
    };

    /* The switch's own fields go straight into the headers: copied through
     * locals, they made a keyless table whose action moves action data with
     * the hash unit, which the driver cannot program on the miss path. A
     * frame that then misses `results` is dropped, so writing them first
     * changes nothing. */
    action set_switch(bit<48> mac, bit<32> ip, bit<16> p) {
        hdr.eth.src = mac;
        hdr.ipv4.src = ip;
        hdr.bth.pkey = p;
    }
    table switch_addr {
        actions = { set_switch; }
        default_action = set_switch(0x0200000000FE, 0x0A0000FE, 0xFFFF);
    }

    action rewrite(bit<48> mac, bit<32> ip, bit<24> qpn, bit<32> rkey, bit<64> result_va) {
        hdr.eth.dst = mac;
        hdr.ipv4.dst = ip;
        hdr.udp.sport = QP_SPORT_BASE[15:14] ++ qpn[13:0];
        hdr.bth.dqpn = qpn;
        hdr.reth.rkey = rkey;
        /* result_va is a multiple of R * C (the control plane checks it): an OR adds the offset. */
        hdr.reth.va = result_va | (bit<64>)hdr.bridge.ring_offset;
    }

    /* The PSN register's index is job * 32 + worker, the bits of the two
     * side by side (host.p4ctl.layout.psn_index). It is its own action with
     * no action data: the index goes through the hash unit, which a keyless
     * table may use only without action data, and a register executed from
     * `results` would have to share its stage with that table's 32K wide
     * entries, more SRAM than a stage has. */
    Hash<bit<32>>(HashAlgorithm_t.IDENTITY) psn_hash;
    action take_psn() {
        hdr.bth.psn = next_psn.execute(psn_hash.get({hdr.bridge.job[9:0], hdr.bridge.worker[4:0]}))[23:0];
    }
    table psn {
        actions = { take_psn; }
        const default_action = take_psn();
    }
    table results {
        key = { hdr.bridge.job: exact; hdr.bridge.worker: exact; }
        actions = { rewrite; NoAction; }
        const default_action = NoAction();
        size = 32768;
    }

    apply {
        if (hdr.bridge.result == 0) {
            exit;   /* to the recirculation port, untouched */
        }
        if (hdr.bridge.op != OP_RESEND) {
            hdr.bridge.worker = (bit<8>)eg_intr_md.egress_rid;
        }
        switch_addr.apply();
        if (!results.apply().hit) {
            eg_dprsr_md.drop_ctl = 1;
            exit;
        }
        hdr.ipv4.tos = 0;
        hdr.ipv4.total_len = CONTRIB_TOTAL + IMMDT_LEN;
        hdr.ipv4.identification = 0;
        hdr.ipv4.flag_rsvd = 0;
        hdr.ipv4.flag_df = 1;
        hdr.ipv4.flag_mf = 0;
        hdr.ipv4.frag_offset = 0;
        hdr.ipv4.ttl = RESULT_TTL;
        hdr.udp.len = CONTRIB_TOTAL + IMMDT_LEN - IPV4_LEN;
        hdr.udp.checksum = 0;
        hdr.bth.opcode = OP_UC_WRITE_ONLY_IMM;
        hdr.bth.se = 0;
        hdr.bth.migreq = 1;
        hdr.bth.pad = 0;
        hdr.bth.tver = 0;
        hdr.bth.resv8a = 0;
        hdr.bth.ackreq = 0;
        hdr.bth.resv7 = 0;
        psn.apply();
        hdr.reth.dma_len = CHUNK_BYTES;
        hdr.immdt.setValid();
        /* ImmDt: bit 30 SATURATED, bits 29-0 the chunk (IMM_SATURATED, IMM_CHUNK_MASK). */
        if (hdr.bridge.saturated == 1) {
            hdr.immdt.imm = 2w1 ++ hdr.bridge.chunk[29:0];
        } else {
            hdr.immdt.imm = 2w0 ++ hdr.bridge.chunk[29:0];
        }
        tx_results.count(0);
        hdr.bridge.setInvalid();
    }
}

control InaggEgressDeparser(packet_out pkt, inout eg_headers_t hdr, in eg_metadata_t meta,
                            in egress_intrinsic_metadata_for_deparser_t eg_dprsr_md) {
    Checksum() ipv4_csum;
    apply {
        if (hdr.ipv4.isValid()) {
            hdr.ipv4.checksum = ipv4_csum.update({
                hdr.ipv4.version, hdr.ipv4.ihl, hdr.ipv4.tos, hdr.ipv4.total_len,
                hdr.ipv4.identification, hdr.ipv4.flag_rsvd, hdr.ipv4.flag_df, hdr.ipv4.flag_mf,
                hdr.ipv4.frag_offset, hdr.ipv4.ttl, hdr.ipv4.protocol, hdr.ipv4.src, hdr.ipv4.dst });
        }
        pkt.emit(hdr);
    }
}

Pipeline(InaggIngressParser(), InaggIngress(), InaggIngressDeparser(),
         InaggEgressParser(), InaggEgress(), InaggEgressDeparser()) pipe;

Switch(pipe) main;
