/* inagg Mode II aggregation switch for BMv2 simple_switch (v1model).
 *
 * The P4 profile of docs/protocol.md section 8: sticky saturating INT32
 * lanes, ImmDt bit 30 (SATURATED) on results with a pinned lane, the full
 * frame checks of section 5 including the ICRC, which BMv2 computes with
 * CRC-32 over the masked headers and every lane (the payload is parsed into
 * header fields). inagg.models.p4profile.P4ProfileSwitch(V1MODEL) is the
 * reference; p4/tests/vectors hold its expected frames. Table and register
 * names are the control plane's (inagg.host.p4ctl): change them together.
 *
 * Build parameters: INAGG_LANES (64 or 256: chunk of 256 or 1024 bytes) and
 * INAGG_SLOTS (slots of the slot memory). */

#include <core.p4>
#include <v1model.p4>

#ifndef INAGG_LANES
#define INAGG_LANES 256
#endif
#ifndef INAGG_SLOTS
#define INAGG_SLOTS 256
#endif

#include "../common/protocol.p4"

#if INAGG_LANES == 256
#define INAGG_LANES_X INAGG_LANES_256
#define INAGG_LOG2_CHUNK 10
#elif INAGG_LANES == 64
#define INAGG_LANES_X INAGG_LANES_64
#define INAGG_LOG2_CHUNK 8
#else
#error INAGG_LANES must be 64 or 256
#endif

const bit<32> CHUNK_BYTES = 4 * INAGG_LANES;
/* IPv4 total length of a contribution: the one layout this parser reads. */
const bit<16> CONTRIB_TOTAL = 20 + 8 + 12 + 16 + 4 * INAGG_LANES + 4;
const bit<32> PSN_ENTRIES = 1024 * 64;  /* one per (job, worker index) */

struct headers_t {
    ethernet_h eth;
    ipv4_h ipv4;
    udp_h udp;
    bth_h bth;
    reth_h reth;
    immdt_h immdt;
    lane_h[INAGG_LANES] lanes;
    icrc_h icrc;
}

struct metadata_t {
    /* switch configuration (table switch_config) */
    bit<16> pkey;
    bit<48> switch_mac;
    bit<32> switch_ip;
    /* the (job, worker) of the destination QPN (table workers) */
    bit<10> job;
    bit<6>  worker;
    bit<32> job_rkey;
    bit<32> slot_base;
    bit<32> slot_mask;
    bit<32> region;
    bit<8>  nworkers;
    bit<9>  worker_port;
    /* per frame */
    bit<32> chunk;
    bit<32> slot;
    bit<32> lane_base;
    bit<1>  add;        /* add this contribution's lanes */
    bit<1>  first;      /* the slot's first contribution: store as is */
    bit<1>  resend;     /* send the stored result to this worker alone */
    bit<1>  saturated;  /* a lane of the emitted lanes is pinned */
    bit<6>  out_worker; /* egress: the worker this copy goes to */
    bit<32> icrc;
}

#define INAGG_EXTRACT_LANE(i) pkt.extract(hdr.lanes.next);

parser InaggParser(packet_in pkt, out headers_t hdr, inout metadata_t meta,
                   inout standard_metadata_t sm) {
    state start {
        pkt.extract(hdr.eth);
        transition select(hdr.eth.ether_type) {
            ETHERTYPE_IPV4: parse_ipv4;
            default: accept;
        }
    }
    state parse_ipv4 {
        pkt.extract(hdr.ipv4);
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
    /* Whatever the opcode, the bytes after the BTH are read in the
     * contribution's layout: the ICRC covers bytes, not their meaning, and
     * the opcode checks come after it. A shorter frame stops here with
     * PacketTooShort; the length checks of the ingress catch it. */
    state parse_roce {
        pkt.extract(hdr.bth);
        pkt.extract(hdr.reth);
        /* Every lane in this one state: simple_switch refuses a select on
         * the stack's lastIndex ("Invalid entry in parse state key"), the
         * usual way to loop over a header stack. */
        INAGG_LANES_X(INAGG_EXTRACT_LANE)
        pkt.extract(hdr.icrc);
        transition accept;
    }
}

control InaggVerifyChecksum(inout headers_t hdr, inout metadata_t meta) {
    apply {
        verify_checksum(hdr.ipv4.isValid(),
            { hdr.ipv4.version, hdr.ipv4.ihl, hdr.ipv4.tos, hdr.ipv4.total_len,
              hdr.ipv4.identification, hdr.ipv4.flag_rsvd, hdr.ipv4.flag_df, hdr.ipv4.flag_mf,
              hdr.ipv4.frag_offset, hdr.ipv4.ttl, hdr.ipv4.protocol, hdr.ipv4.src, hdr.ipv4.dst },
            hdr.ipv4.checksum, HashAlgorithm.csum16);
    }
}

#define INAGG_ICRC_LANE(i) , hdr.lanes[i].v

/* Sticky saturating INT32 addition of lane i (inagg.models.p4profile). */
#define INAGG_V1_LANE(i) \
    lanes.read(acc, meta.lane_base + i); \
    if (meta.add == 1) { \
        if (meta.first == 1) { \
            acc = hdr.lanes[i].v; \
        } else if (acc != I32_MIN && acc != I32_MAX) { \
            sum = (int<34>)(int<32>)acc + (int<34>)(int<32>)hdr.lanes[i].v; \
            if (sum > SUM_MAX) { acc = I32_MAX; } \
            else if (sum < SUM_MIN) { acc = I32_MIN; } \
            else { acc = (bit<32>)(int<32>)sum; } \
        } \
        lanes.write(meta.lane_base + i, acc); \
    } \
    hdr.lanes[i].v = acc; \
    if (acc == I32_MIN || acc == I32_MAX) { meta.saturated = 1; }

control InaggIngress(inout headers_t hdr, inout metadata_t meta,
                     inout standard_metadata_t sm) {
    counter(N_COUNTERS, CounterType.packets) ingress_counters;
    register<bit<2>>(INAGG_SLOTS) slot_state;
    register<bit<32>>(INAGG_SLOTS) slot_chunk;
    register<bit<64>>(INAGG_SLOTS) slot_bitmap;
    register<bit<8>>(INAGG_SLOTS) slot_count;
    /* 1 while the slot has not completed since it was FREE (protocol.md "Liveness"). */
    register<bit<1>>(INAGG_SLOTS) slot_first;
    register<bit<32>>(INAGG_SLOTS * INAGG_LANES) lanes;

    const int<34> SUM_MAX = 2147483647;
    const int<34> SUM_MIN = -2147483648;

    action drop(bit<32> reason) {
        ingress_counters.count(reason);
        mark_to_drop(sm);
    }

    action set_switch(bit<16> pkey, bit<48> mac, bit<32> ip) {
        meta.pkey = pkey;
        meta.switch_mac = mac;
        meta.switch_ip = ip;
    }

    /* Keyless: the control plane sets the default action. */
    table switch_config {
        actions = { set_switch; }
        default_action = set_switch(0xFFFF, 0x0200000000FE, 0x0A0000FE);
    }

    action set_worker(bit<10> job, bit<6> worker, bit<32> rkey, bit<32> slot_base,
                      bit<32> slot_mask, bit<8> nworkers, bit<9> port) {
        meta.job = job;
        meta.worker = worker;
        meta.job_rkey = rkey;
        meta.slot_base = slot_base;
        meta.slot_mask = slot_mask;
        meta.region = slot_mask + 1;
        meta.nworkers = nworkers;
        meta.worker_port = port;
    }

    action unknown_qpn() {
        drop(CNT_DROP_UNKNOWN_QPN);
    }

    /* One entry per (job, worker): the switch QPN names both. */
    table workers {
        key = { hdr.bth.dqpn: exact; }
        actions = { set_worker; unknown_qpn; }
        const default_action = unknown_qpn();
        size = 65536;
    }

    apply {
        ingress_counters.count(CNT_RX_FRAMES);
        /* Frame checks in the order of docs/protocol.md section 5. */
        if (!hdr.eth.isValid()) { drop(CNT_DROP_BAD_LENGTH); exit; }
        if (hdr.eth.ether_type != ETHERTYPE_IPV4) { drop(CNT_DROP_NON_ROCE); exit; }
        if (!hdr.ipv4.isValid()) { drop(CNT_DROP_BAD_LENGTH); exit; }
        if (hdr.ipv4.version != 4 || hdr.ipv4.ihl != 5 || hdr.ipv4.flag_rsvd == 1 || hdr.ipv4.flag_mf == 1
                || hdr.ipv4.frag_offset != 0 || sm.checksum_error == 1) {
            drop(CNT_DROP_BAD_HEADER); exit;
        }
        if (hdr.ipv4.protocol != IP_PROTO_UDP) { drop(CNT_DROP_NON_ROCE); exit; }
        if (hdr.ipv4.total_len < IPV4_LEN + UDP_LEN
                || 14 + (bit<32>)hdr.ipv4.total_len > sm.packet_length) {
            drop(CNT_DROP_BAD_LENGTH); exit;
        }
        if (hdr.udp.dport != ROCE_UDP_PORT) { drop(CNT_DROP_NON_ROCE); exit; }
        if (hdr.udp.len != hdr.ipv4.total_len - IPV4_LEN
                || hdr.ipv4.total_len < IPV4_LEN + UDP_LEN + BTH_LEN + ICRC_LEN
                || hdr.ipv4.total_len != CONTRIB_TOTAL) {
            drop(CNT_DROP_BAD_LENGTH); exit;
        }
        hash(meta.icrc, HashAlgorithm.crc32, 32w0,
             { INAGG_ICRC_HEADERS(hdr) INAGG_LANES_X(INAGG_ICRC_LANE) }, 64w0x100000000);
        if (hdr.icrc.wire != meta.icrc[7:0] ++ meta.icrc[15:8] ++ meta.icrc[23:16] ++ meta.icrc[31:24]) {
            drop(CNT_DROP_BAD_ICRC); exit;
        }
        switch_config.apply();
        if (hdr.bth.tver != 0 || hdr.bth.pkey != meta.pkey) { drop(CNT_DROP_BAD_HEADER); exit; }
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
        /* Check 14: on another port than its own the QPN names no worker. */
        if (sm.ingress_port != meta.worker_port) { drop(CNT_DROP_UNKNOWN_QPN); exit; }
        if (hdr.reth.rkey != meta.job_rkey) { drop(CNT_DROP_BAD_RKEY); exit; }
        if (hdr.reth.va[INAGG_LOG2_CHUNK - 1:0] != 0 || hdr.reth.va[63:32 + INAGG_LOG2_CHUNK] != 0) {
            drop(CNT_DROP_BAD_ADDRESS); exit;
        }

        /* Slot rules, docs/protocol.md section 3. */
        meta.chunk = hdr.reth.va[31 + INAGG_LOG2_CHUNK:INAGG_LOG2_CHUNK];
        meta.slot = meta.slot_base + (meta.chunk & meta.slot_mask);
        bit<2> state;
        bit<32> chunk;
        bit<64> bitmap;
        bit<8> count;
        bit<1> first;
        slot_state.read(state, meta.slot);
        slot_chunk.read(chunk, meta.slot);
        slot_bitmap.read(bitmap, meta.slot);
        slot_count.read(count, meta.slot);
        slot_first.read(first, meta.slot);
        if (state == SLOT_FREE) {
            state = SLOT_AGG; chunk = meta.chunk; bitmap = 0; count = 0; first = 1;
        } else if (chunk != meta.chunk) {
            bit<32> ahead = meta.chunk - chunk;
            if (first == 0 && ahead[31:31] == 1) { drop(CNT_DROP_STALE); exit; }
            if (first == 0 && (ahead != meta.region || state != SLOT_DONE)) { drop(CNT_DROP_WINDOW); exit; }
            /* The next generation: every worker holds the old result (protocol.md
             * "Slot reuse"). Or, first bit set, one of the two chunks is a stray,
             * which must not hold the slot for good ("Liveness"). */
            state = SLOT_AGG; chunk = meta.chunk; bitmap = 0; count = 0;
        }
        bit<64> wbit = (bit<64>)1 << meta.worker;
        meta.lane_base = meta.slot * INAGG_LANES;
        meta.saturated = 0;
        if ((bitmap & wbit) != 0) {
            ingress_counters.count(CNT_DUP_CONTRIB);
            if (state != SLOT_DONE) { mark_to_drop(sm); exit; }
            ingress_counters.count(CNT_TX_RESENDS);
            meta.add = 0;
            meta.resend = 1;
        } else {
            meta.add = 1;
            meta.first = (count == 0) ? 1w1 : 1w0;
            meta.resend = 0;
            bitmap = bitmap | wbit;
            count = count + 1;
            ingress_counters.count(CNT_RX_CONTRIB);
        }
        bit<32> acc;
        int<34> sum;
        INAGG_LANES_X(INAGG_V1_LANE)
        if (meta.resend == 1) {
            sm.egress_spec = meta.worker_port;
            meta.out_worker = meta.worker;
        } else if (count == meta.nworkers) {
            state = SLOT_DONE;
            first = 0;
            ingress_counters.count(CNT_COMPLETED);
            if (meta.saturated == 1) { ingress_counters.count(CNT_PROMOTED); }
            /* One multicast group per job, one replica per worker (rid = worker index). */
            sm.mcast_grp = (bit<16>)meta.job + 1;
        } else {
            mark_to_drop(sm);
        }
        slot_state.write(meta.slot, state);
        slot_chunk.write(meta.slot, chunk);
        slot_bitmap.write(meta.slot, bitmap);
        slot_count.write(meta.slot, count);
        slot_first.write(meta.slot, first);
    }
}

control InaggEgress(inout headers_t hdr, inout metadata_t meta,
                    inout standard_metadata_t sm) {
    counter(N_COUNTERS, CounterType.packets) egress_counters;
    register<bit<24>>(PSN_ENTRIES) result_psn;

    action rewrite(bit<48> mac, bit<32> ip, bit<24> qpn, bit<32> rkey, bit<64> result_va) {
        hdr.eth.dst = mac;
        hdr.eth.src = meta.switch_mac;
        hdr.ipv4.tos = 0;
        hdr.ipv4.total_len = CONTRIB_TOTAL + IMMDT_LEN;
        hdr.ipv4.identification = 0;
        hdr.ipv4.flag_rsvd = 0;
        hdr.ipv4.flag_df = 1;
        hdr.ipv4.flag_mf = 0;
        hdr.ipv4.frag_offset = 0;
        hdr.ipv4.ttl = RESULT_TTL;
        hdr.ipv4.src = meta.switch_ip;
        hdr.ipv4.dst = ip;
        hdr.udp.sport = QP_SPORT_BASE | (bit<16>)qpn[13:0];
        hdr.udp.len = CONTRIB_TOTAL + IMMDT_LEN - IPV4_LEN;
        hdr.udp.checksum = 0;
        hdr.bth.opcode = OP_UC_WRITE_ONLY_IMM;
        hdr.bth.se = 0;
        hdr.bth.migreq = 1;
        hdr.bth.pad = 0;
        hdr.bth.tver = 0;
        hdr.bth.pkey = meta.pkey;
        hdr.bth.resv8a = 0;
        hdr.bth.dqpn = qpn;
        hdr.bth.ackreq = 0;
        hdr.bth.resv7 = 0;
        hdr.reth.va = result_va + (bit<64>)((meta.chunk & meta.slot_mask) * CHUNK_BYTES);
        hdr.reth.rkey = rkey;
        hdr.reth.dma_len = CHUNK_BYTES;
        hdr.immdt.setValid();
        hdr.immdt.imm = (meta.saturated == 1 ? IMM_SATURATED : 32w0) | (meta.chunk & IMM_CHUNK_MASK);
    }

    table results {
        key = { meta.job: exact; meta.out_worker: exact; }
        actions = { rewrite; NoAction; }
        const default_action = NoAction();
        size = 65536;
    }

    apply {
        if (meta.resend == 0) {
            meta.out_worker = (bit<6>)sm.egress_rid;
        }
        if (!results.apply().hit) {
            mark_to_drop(sm);
            exit;
        }
        bit<32> psn_index = (bit<32>)meta.job * 64 + (bit<32>)meta.out_worker;
        bit<24> psn;
        result_psn.read(psn, psn_index);
        result_psn.write(psn_index, psn + 1);
        hdr.bth.psn = psn;
        hash(meta.icrc, HashAlgorithm.crc32, 32w0,
             { INAGG_ICRC_HEADERS(hdr), hdr.immdt.imm INAGG_LANES_X(INAGG_ICRC_LANE) },
             64w0x100000000);
        hdr.icrc.wire = meta.icrc[7:0] ++ meta.icrc[15:8] ++ meta.icrc[23:16] ++ meta.icrc[31:24];
        egress_counters.count(CNT_TX_RESULTS);
        /* Ethernet padding of the contribution stays behind. */
        truncate(14 + (bit<32>)CONTRIB_TOTAL + (bit<32>)IMMDT_LEN);
    }
}

control InaggComputeChecksum(inout headers_t hdr, inout metadata_t meta) {
    apply {
        update_checksum(hdr.ipv4.isValid(),
            { hdr.ipv4.version, hdr.ipv4.ihl, hdr.ipv4.tos, hdr.ipv4.total_len,
              hdr.ipv4.identification, hdr.ipv4.flag_rsvd, hdr.ipv4.flag_df, hdr.ipv4.flag_mf,
              hdr.ipv4.frag_offset, hdr.ipv4.ttl, hdr.ipv4.protocol, hdr.ipv4.src, hdr.ipv4.dst },
            hdr.ipv4.checksum, HashAlgorithm.csum16);
    }
}

control InaggDeparser(packet_out pkt, in headers_t hdr) {
    apply {
        pkt.emit(hdr.eth);
        pkt.emit(hdr.ipv4);
        pkt.emit(hdr.udp);
        pkt.emit(hdr.bth);
        pkt.emit(hdr.reth);
        pkt.emit(hdr.immdt);
        pkt.emit(hdr.lanes);
        pkt.emit(hdr.icrc);
    }
}

V1Switch(InaggParser(), InaggVerifyChecksum(), InaggIngress(), InaggEgress(),
         InaggComputeChecksum(), InaggDeparser()) main;
