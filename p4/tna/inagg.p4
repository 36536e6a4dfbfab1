/* inagg Mode II aggregation switch for Tofino (TNA), Tofino 1 by default.
 *
 * The P4 profile of docs/protocol.md section 8 with the Tofino limits of
 * inagg.models.p4profile.TNA: chunks of 256 bytes (64 lanes), at most 32
 * workers per job, no ICRC check (results carry an ICRC field of zero; see
 * docs/p4.md), sticky saturating INT32 lanes and ImmDt bit 30 (SATURATED).
 *
 * A pipeline pass adds 32 lanes (one 32-bit register per lane, four per
 * stage in stages 4-11), so a chunk takes two passes: pass 0 runs the frame
 * checks, the slot rules and lanes 0-31, then recirculates the frame with a
 * bridge header; pass 1 adds lanes 32-63 into the same registers (entry
 * 2 * slot + 1) and multicasts the result. The egress parser flags pinned
 * lanes, and the egress rewrites one copy per worker.
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
#define INAGG_RECIRC_PORT 68   /* pipe 0's recirculation port on Tofino 1 */
#endif

const bit<32> CHUNK_BYTES = 256;
const bit<16> CONTRIB_TOTAL = 20 + 8 + 12 + 16 + 256 + 4;
const bit<32> PSN_ENTRIES = 1024 * 32;  /* one per (job, worker index) */

/* Verdicts of the slot rules (docs/protocol.md section 3). */
const bit<8> V_FIRST = 1;   /* the slot (re)starts with this chunk */
const bit<8> V_SAME = 2;    /* the slot holds this chunk, still aggregating */
const bit<8> V_DONE = 3;    /* the slot holds this chunk, complete */
const bit<8> V_STALE = 4;
const bit<8> V_WINDOW = 5;

/* What pass 0 decided, for pass 1 and the egress. */
const bit<2> OP_ADD = 0;
const bit<2> OP_FIRST = 1;
const bit<2> OP_RESEND = 2;

header bridge_h {
    bit<1>  pass;       /* 0: ingress to recirculation, 1: to the workers */
    bit<1>  complete;   /* this contribution completed the chunk */
    bit<2>  op;
    bit<4>  _pad0;
    bit<6>  worker;
    bit<10> job;
    bit<7>  _pad1;
    bit<9>  port;       /* the contributing worker's port, for a resend */
    bit<16> mcast_grp;  /* the job's group, for a completed chunk */
    bit<32> slot;
    bit<32> chunk;
    bit<32> ring_offset;  /* (chunk mod R) * C: the result's offset in the ring */
}

struct headers_t {
    bridge_h bridge;
    ethernet_h eth;
    ipv4_h ipv4;
    udp_h udp;
    bth_h bth;
    reth_h reth;
    immdt_h immdt;
    lane_h[64] lanes;
    icrc_h icrc;
}

#define INAGG_TNA_LANE_IN(i) bit<32> lane_in_##i;

struct slot_key_t {
    bit<32> chunk;
    bit<32> state;
}

struct ig_metadata_t {
    bool    csum_err;
    bit<10> job;
    bit<6>  worker;
    bit<32> rkey;
    bit<32> slot_base;
    bit<32> slot_mask;
    bit<32> wbit;
    bit<32> full;
    bit<32> chunk;
    bit<32> prev_chunk;   /* chunk - R: the generation a DONE slot may give way to */
    bit<32> slot;
    bit<32> lane_index;
    bit<32> old_bitmap;
    bit<8>  verdict;
    bit<9>  worker_port;
    bit<16> mcast_grp;
    /* The 32 lanes this pass adds: lanes 0-31 in pass 0, 32-63 in pass 1. The
     * register actions read them from here, metadata that every path of the
     * apply block writes before it executes them. */
    INAGG_LANES_32(INAGG_TNA_LANE_IN)
}

struct eg_metadata_t {
    bit<1> saturated;
}

parser InaggIngressParser(packet_in pkt, out headers_t hdr, out ig_metadata_t meta,
                          out ingress_intrinsic_metadata_t ig_intr_md) {
    Checksum() ipv4_csum;

    state start {
        pkt.extract(ig_intr_md);
        pkt.advance(PORT_METADATA_SIZE);
        meta.csum_err = false;
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
        transition parse_lanes;
    }
    state parse_lanes {
        pkt.extract(hdr.lanes.next);
        transition select(hdr.lanes.lastIndex) {
            63: parse_icrc;
            default: parse_lanes;
        }
    }
    state parse_icrc {
        pkt.extract(hdr.icrc);
        transition accept;
    }
}

/* Lane i of this pass: register lane_<i> holds lane i at entry 2 * slot and
 * lane 32 + i at entry 2 * slot + 1. */
#define INAGG_TNA_LANE_DECL(i) \
    Register<bit<32>, bit<32>>(2 * INAGG_SLOTS) lane_##i; \
    RegisterAction<bit<32>, bit<32>, bit<32>>(lane_##i) lane_add_##i = { \
        void apply(inout bit<32> v, out bit<32> rv) { \
            if (v != I32_MIN && v != I32_MAX) { \
                v = (bit<32>)((int<32>)v |+| (int<32>)meta.lane_in_##i); \
            } \
            rv = v; \
        } \
    }; \
    RegisterAction<bit<32>, bit<32>, bit<32>>(lane_##i) lane_store_##i = { \
        void apply(inout bit<32> v, out bit<32> rv) { \
            v = meta.lane_in_##i; \
            rv = v; \
        } \
    }; \
    RegisterAction<bit<32>, bit<32>, bit<32>>(lane_##i) lane_read_##i = { \
        void apply(inout bit<32> v, out bit<32> rv) { \
            rv = v; \
        } \
    };

/* The lane field this pass feeds to lane register i. */
#define INAGG_TNA_LANE_SELECT_LO(i) meta.lane_in_##i = hdr.lanes[i].v;
#define INAGG_TNA_LANE_SELECT_HI(i) meta.lane_in_##i = hdr.lanes[i + 32].v;

#define INAGG_TNA_LANE_APPLY_LO(i) \
    if (hdr.bridge.op == OP_ADD) { hdr.lanes[i].v = lane_add_##i.execute(meta.lane_index); } \
    else if (hdr.bridge.op == OP_FIRST) { hdr.lanes[i].v = lane_store_##i.execute(meta.lane_index); } \
    else { hdr.lanes[i].v = lane_read_##i.execute(meta.lane_index); }
#define INAGG_TNA_LANE_APPLY_HI(i) \
    if (hdr.bridge.op == OP_ADD) { hdr.lanes[i + 32].v = lane_add_##i.execute(meta.lane_index); } \
    else if (hdr.bridge.op == OP_FIRST) { hdr.lanes[i + 32].v = lane_store_##i.execute(meta.lane_index); } \
    else { hdr.lanes[i + 32].v = lane_read_##i.execute(meta.lane_index); }

control InaggIngress(inout headers_t hdr, inout ig_metadata_t meta,
                     in ingress_intrinsic_metadata_t ig_intr_md,
                     in ingress_intrinsic_metadata_from_parser_t ig_prsr_md,
                     inout ingress_intrinsic_metadata_for_deparser_t ig_dprsr_md,
                     inout ingress_intrinsic_metadata_for_tm_t ig_tm_md) {
    /* A Tofino counter counts once per pass: RX_FRAMES has its own, the
     * verdict of pass 0 and of pass 1 share the event counter. */
    Counter<bit<32>, bit<1>>(1, CounterType_t.PACKETS) rx_frames;
    Counter<bit<32>, bit<32>>(N_COUNTERS, CounterType_t.PACKETS) ingress_events;

    Register<slot_key_t, bit<32>>(INAGG_SLOTS) slot_key;
    Register<bit<32>, bit<32>>(INAGG_SLOTS) slot_bitmap;

    RegisterAction<slot_key_t, bit<32>, bit<8>>(slot_key) slot_claim = {
        void apply(inout slot_key_t v, out bit<8> rv) {
            if (v.state == (bit<32>)SLOT_FREE
                    || (v.chunk == meta.prev_chunk && v.state == (bit<32>)SLOT_DONE)) {
                v.chunk = meta.chunk;
                v.state = (bit<32>)SLOT_AGG;
                rv = V_FIRST;
            } else if (v.chunk == meta.chunk) {
                rv = v.state == (bit<32>)SLOT_DONE ? V_DONE : V_SAME;
            } else if (((meta.chunk - v.chunk) & 0x80000000) != 0) {
                rv = V_STALE;
            } else {
                rv = V_WINDOW;
            }
        }
    };
    RegisterAction<slot_key_t, bit<32>, bit<8>>(slot_key) slot_done = {
        void apply(inout slot_key_t v) {
            v.state = (bit<32>)SLOT_DONE;
        }
    };
    RegisterAction<bit<32>, bit<32>, bit<32>>(slot_bitmap) bitmap_start = {
        void apply(inout bit<32> v, out bit<32> rv) {
            rv = 0;
            v = meta.wbit;
        }
    };
    RegisterAction<bit<32>, bit<32>, bit<32>>(slot_bitmap) bitmap_join = {
        void apply(inout bit<32> v, out bit<32> rv) {
            rv = v;
            v = v | meta.wbit;
        }
    };

    INAGG_LANES_32(INAGG_TNA_LANE_DECL)

    action drop(bit<32> reason) {
        ingress_events.count(reason);
        ig_dprsr_md.drop_ctl = 1;
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
        drop(CNT_DROP_UNKNOWN_QPN);
    }
    table workers {
        key = { hdr.bth.dqpn: exact; }
        actions = { set_worker; unknown_qpn; }
        const default_action = unknown_qpn();
        size = 32768;
    }

    apply {
        if (hdr.bridge.isValid()) {
            /* Pass 1: lanes 32-63, then the result. */
            meta.lane_index = hdr.bridge.slot * 2 + 1;
            INAGG_LANES_32(INAGG_TNA_LANE_SELECT_HI)
            INAGG_LANES_32(INAGG_TNA_LANE_APPLY_HI)
            hdr.bridge.pass = 1;
            if (hdr.bridge.op == OP_RESEND) {
                ig_tm_md.ucast_egress_port = hdr.bridge.port;
                ingress_events.count(CNT_TX_RESENDS);
            } else if (hdr.bridge.complete == 1) {
                slot_done.execute(hdr.bridge.slot);
                ingress_events.count(CNT_COMPLETED);
                ig_tm_md.mcast_grp_a = hdr.bridge.mcast_grp;
            } else {
                ig_dprsr_md.drop_ctl = 1;
            }
            exit;
        }

        rx_frames.count(0);
        /* Frame checks in the order of docs/protocol.md section 5; check 9
         * (ICRC) is not possible on Tofino. */
        if (!hdr.eth.isValid()) { drop(CNT_DROP_BAD_LENGTH); exit; }
        if (hdr.eth.ether_type != ETHERTYPE_IPV4) { drop(CNT_DROP_NON_ROCE); exit; }
        if (!hdr.ipv4.isValid()) { drop(CNT_DROP_BAD_LENGTH); exit; }
        if (hdr.ipv4.version != 4 || hdr.ipv4.ihl != 5 || hdr.ipv4.flag_mf == 1
                || hdr.ipv4.frag_offset != 0 || meta.csum_err) {
            drop(CNT_DROP_BAD_HEADER); exit;
        }
        if (hdr.ipv4.protocol != IP_PROTO_UDP) { drop(CNT_DROP_NON_ROCE); exit; }
        if (hdr.ipv4.total_len < IPV4_LEN + UDP_LEN) { drop(CNT_DROP_BAD_LENGTH); exit; }
        if (!hdr.udp.isValid()) { drop(CNT_DROP_BAD_LENGTH); exit; }
        if (hdr.udp.dport != ROCE_UDP_PORT) { drop(CNT_DROP_NON_ROCE); exit; }
        if ((ig_prsr_md.parser_err & PARSER_ERROR_PARTIAL_HDR) != 0
                || hdr.udp.len != hdr.ipv4.total_len - IPV4_LEN
                || hdr.ipv4.total_len != CONTRIB_TOTAL) {
            drop(CNT_DROP_BAD_LENGTH); exit;
        }
        switch_config.apply();
        if (hdr.bth.tver != 0 || hdr.bth.pkey != pkey) { drop(CNT_DROP_BAD_HEADER); exit; }
        bit<32> dma_room = CHUNK_BYTES - (bit<32>)hdr.bth.pad;
        if (hdr.bth.opcode == OP_RC_WRITE_ONLY_IMM || hdr.bth.opcode == OP_UC_WRITE_ONLY_IMM) {
            dma_room = dma_room - 4;
        }
        if ((hdr.bth.opcode == OP_RC_WRITE_ONLY || hdr.bth.opcode == OP_RC_WRITE_ONLY_IMM
                || hdr.bth.opcode == OP_UC_WRITE_ONLY || hdr.bth.opcode == OP_UC_WRITE_ONLY_IMM)
                && hdr.reth.dma_len != dma_room) {
            drop(CNT_DROP_BAD_LENGTH); exit;
        }
        if (hdr.bth.opcode != OP_UC_WRITE_ONLY) { drop(CNT_DROP_BAD_OPCODE); exit; }
        if (hdr.reth.dma_len != CHUNK_BYTES || hdr.bth.pad != 0) { drop(CNT_DROP_BAD_LENGTH); exit; }
        if (!workers.apply().hit) { exit; }
        if (hdr.reth.rkey != meta.rkey) { drop(CNT_DROP_BAD_RKEY); exit; }
        if (hdr.reth.va[7:0] != 0 || hdr.reth.va[63:40] != 0) { drop(CNT_DROP_BAD_ADDRESS); exit; }

        /* Slot rules, docs/protocol.md section 3. */
        meta.chunk = hdr.reth.va[39:8];
        meta.prev_chunk = meta.chunk - (meta.slot_mask + 1);
        meta.slot = meta.slot_base | (meta.chunk & meta.slot_mask);
        meta.verdict = slot_claim.execute(meta.slot);
        if (meta.verdict == V_STALE) { drop(CNT_DROP_STALE); exit; }
        if (meta.verdict == V_WINDOW) { drop(CNT_DROP_WINDOW); exit; }
        hdr.bridge.setValid();
        hdr.bridge.pass = 0;
        hdr.bridge.worker = meta.worker;
        hdr.bridge.job = meta.job;
        hdr.bridge.port = meta.worker_port;
        hdr.bridge.mcast_grp = meta.mcast_grp;
        hdr.bridge.slot = meta.slot;
        hdr.bridge.chunk = meta.chunk;
        hdr.bridge.ring_offset = (meta.chunk & meta.slot_mask) << 8;
        if (meta.verdict == V_FIRST) {
            meta.old_bitmap = bitmap_start.execute(meta.slot);
            hdr.bridge.op = OP_FIRST;
        } else {
            meta.old_bitmap = bitmap_join.execute(meta.slot);
            hdr.bridge.op = OP_ADD;
        }
        if ((meta.old_bitmap & meta.wbit) != 0) {
            ingress_events.count(CNT_DUP_CONTRIB);
            if (meta.verdict != V_DONE) { ig_dprsr_md.drop_ctl = 1; exit; }
            hdr.bridge.op = OP_RESEND;
        } else {
            ingress_events.count(CNT_RX_CONTRIB);
        }
        hdr.bridge.complete = ((meta.old_bitmap | meta.wbit) == meta.full) ? 1w1 : 1w0;
        meta.lane_index = meta.slot * 2;
        INAGG_LANES_32(INAGG_TNA_LANE_SELECT_LO)
        INAGG_LANES_32(INAGG_TNA_LANE_APPLY_LO)
        /* Every accepted contribution and every resend takes pass 1 for lanes 32-63. */
        ig_tm_md.ucast_egress_port = INAGG_RECIRC_PORT;
    }
}

control InaggIngressDeparser(packet_out pkt, inout headers_t hdr, in ig_metadata_t meta,
                             in ingress_intrinsic_metadata_for_deparser_t ig_dprsr_md) {
    apply {
        pkt.emit(hdr);
    }
}

parser InaggEgressParser(packet_in pkt, out headers_t hdr, out eg_metadata_t meta,
                         out egress_intrinsic_metadata_t eg_intr_md) {
    state start {
        pkt.extract(eg_intr_md);
        meta.saturated = 0;
        pkt.extract(hdr.bridge);
        transition select(hdr.bridge.pass) {
            1: parse_eth;
            default: accept;   /* on its way to pass 1: left as it is */
        }
    }
    state parse_eth {
        pkt.extract(hdr.eth);
        pkt.extract(hdr.ipv4);
        pkt.extract(hdr.udp);
        pkt.extract(hdr.bth);
        pkt.extract(hdr.reth);
        transition lane;
    }
    /* SATURATED: a result lane at INT32_MIN or INT32_MAX (inagg.models.p4profile). */
    state lane {
        transition select(pkt.lookahead<bit<32>>()) {
            I32_MIN: pinned;
            I32_MAX: pinned;
            default: next_lane;
        }
    }
    state pinned {
        meta.saturated = 1;
        transition next_lane;
    }
    state next_lane {
        pkt.extract(hdr.lanes.next);
        transition select(hdr.lanes.lastIndex) {
            63: parse_icrc;
            default: lane;
        }
    }
    state parse_icrc {
        pkt.extract(hdr.icrc);
        transition accept;
    }
}

control InaggEgress(inout headers_t hdr, inout eg_metadata_t meta,
                    in egress_intrinsic_metadata_t eg_intr_md,
                    in egress_intrinsic_metadata_from_parser_t eg_prsr_md,
                    inout egress_intrinsic_metadata_for_deparser_t eg_dprsr_md,
                    inout egress_intrinsic_metadata_for_output_port_t eg_oport_md) {
    Counter<bit<32>, bit<1>>(1, CounterType_t.PACKETS) tx_results;
    Counter<bit<32>, bit<1>>(1, CounterType_t.PACKETS) promoted;
    Register<bit<32>, bit<32>>(PSN_ENTRIES) result_psn;
    RegisterAction<bit<32>, bit<32>, bit<32>>(result_psn) next_psn = {
        void apply(inout bit<32> v, out bit<32> rv) {
            rv = v;
            v = (v + 1) & 0xFFFFFF;
        }
    };

    bit<48> switch_mac = 0;
    bit<32> switch_ip = 0;
    bit<16> pkey = 0xFFFF;
    action set_switch(bit<48> mac, bit<32> ip, bit<16> p) {
        switch_mac = mac;
        switch_ip = ip;
        pkey = p;
    }
    table switch_addr {
        actions = { set_switch; }
        default_action = set_switch(0x0200000000FE, 0x0A0000FE, 0xFFFF);
    }

    bit<32> psn_index = 0;
    action rewrite(bit<48> mac, bit<32> ip, bit<24> qpn, bit<32> rkey, bit<64> result_va,
                   bit<32> psn_slot) {
        hdr.eth.dst = mac;
        hdr.ipv4.dst = ip;
        hdr.udp.sport = RESULT_SPORT_BASE | (bit<16>)qpn[13:0];
        hdr.bth.dqpn = qpn;
        hdr.reth.rkey = rkey;
        /* result_va is a multiple of R * C (the control plane checks it): an OR adds the offset. */
        hdr.reth.va = result_va | (bit<64>)hdr.bridge.ring_offset;
        psn_index = psn_slot;
    }
    table results {
        key = { hdr.bridge.job: exact; hdr.bridge.worker: exact; }
        actions = { rewrite; NoAction; }
        const default_action = NoAction();
        size = 32768;
    }

    apply {
        if (hdr.bridge.pass == 0) {
            exit;   /* to the recirculation port, untouched */
        }
        if (hdr.bridge.op != OP_RESEND) {
            hdr.bridge.worker = (bit<6>)eg_intr_md.egress_rid;
        }
        switch_addr.apply();
        if (!results.apply().hit) {
            eg_dprsr_md.drop_ctl = 1;
            exit;
        }
        hdr.eth.src = switch_mac;
        hdr.ipv4.tos = 0;
        hdr.ipv4.total_len = CONTRIB_TOTAL + IMMDT_LEN;
        hdr.ipv4.identification = 0;
        hdr.ipv4.flag_rsvd = 0;
        hdr.ipv4.flag_df = 1;
        hdr.ipv4.flag_mf = 0;
        hdr.ipv4.frag_offset = 0;
        hdr.ipv4.ttl = RESULT_TTL;
        hdr.ipv4.src = switch_ip;
        hdr.udp.len = CONTRIB_TOTAL + IMMDT_LEN - IPV4_LEN;
        hdr.udp.checksum = 0;
        hdr.bth.opcode = OP_UC_WRITE_ONLY_IMM;
        hdr.bth.se = 0;
        hdr.bth.migreq = 1;
        hdr.bth.pad = 0;
        hdr.bth.tver = 0;
        hdr.bth.pkey = pkey;
        hdr.bth.resv8a = 0;
        hdr.bth.ackreq = 0;
        hdr.bth.resv7 = 0;
        hdr.bth.psn = next_psn.execute(psn_index)[23:0];
        hdr.reth.dma_len = CHUNK_BYTES;
        hdr.immdt.setValid();
        hdr.immdt.imm = (meta.saturated == 1 ? IMM_SATURATED : 32w0) | (hdr.bridge.chunk & IMM_CHUNK_MASK);
        /* No ICRC engine covers the frame: the field is zero, never stale (docs/p4.md). */
        hdr.icrc.wire = 0;
        tx_results.count(0);
        if (meta.saturated == 1 && hdr.bridge.op != OP_RESEND && eg_intr_md.egress_rid_first == 1) {
            promoted.count(0);
        }
        hdr.bridge.setInvalid();
    }
}

control InaggEgressDeparser(packet_out pkt, inout headers_t hdr, in eg_metadata_t meta,
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
