/* The inagg wire protocol in P4: constants, headers and lane macros shared
 * by the TNA and v1model programs. docs/protocol.md is the specification,
 * inagg.models.protocol holds the same numbers and inagg.models.frame the
 * same headers (field names, widths, the fields the ICRC masks);
 * tests/p4/test_p4_sources.py checks that they agree. */

#ifndef INAGG_PROTOCOL_P4
#define INAGG_PROTOCOL_P4

const bit<16> ETHERTYPE_IPV4 = 0x0800;
const bit<8>  IP_PROTO_UDP = 17;
const bit<16> ROCE_UDP_PORT = 4791;
const bit<8>  QPN_PREFIX = 0xA5;
const bit<8>  OP_RC_WRITE_ONLY = 0x0A;
const bit<8>  OP_RC_WRITE_ONLY_IMM = 0x0B;
const bit<8>  OP_UC_WRITE_ONLY = 0x2A;
const bit<8>  OP_UC_WRITE_ONLY_IMM = 0x2B;
const bit<32> IMM_SATURATED = 0x40000000;
const bit<32> IMM_CHUNK_MASK = 0x3FFFFFFF;
const bit<8>  RESULT_TTL = 64;
const bit<16> QP_SPORT_BASE = 0xC000;
const bit<32> I32_MIN = 0x80000000;
const bit<32> I32_MAX = 0x7FFFFFFF;

const bit<16> IPV4_LEN = 20;
const bit<16> UDP_LEN = 8;
const bit<16> BTH_LEN = 12;
const bit<16> RETH_LEN = 16;
const bit<16> IMMDT_LEN = 4;
const bit<16> ICRC_LEN = 4;

/* Counter indices: inagg.models.protocol.Counter, in register order. */
const bit<32> CNT_RX_FRAMES = 0;
const bit<32> CNT_RX_CONTRIB = 1;
const bit<32> CNT_TX_RESULTS = 2;
const bit<32> CNT_TX_RESENDS = 3;
const bit<32> CNT_COMPLETED = 4;
const bit<32> CNT_PROMOTED = 5;
const bit<32> CNT_DUP_CONTRIB = 6;
const bit<32> CNT_DROP_NON_ROCE = 7;
const bit<32> CNT_DROP_BAD_HEADER = 8;
const bit<32> CNT_DROP_BAD_LENGTH = 9;
const bit<32> CNT_DROP_BAD_ICRC = 10;
const bit<32> CNT_DROP_BAD_OPCODE = 11;
const bit<32> CNT_DROP_UNKNOWN_QPN = 12;
const bit<32> CNT_DROP_BAD_RKEY = 13;
const bit<32> CNT_DROP_BAD_ADDRESS = 14;
const bit<32> CNT_DROP_STALE = 15;
const bit<32> CNT_DROP_WINDOW = 16;
const bit<32> CNT_DROP_COLLISION = 17;
const bit<32> CNT_EXC_INSERTS = 18;
const bit<32> CNT_EXC_REFUSED = 19;
const bit<32> CNT_ACK_REFLECTED = 20;
const bit<32> CNT_DROP_PSN_AHEAD = 21;
const bit<32> CNT_ACK_SENT = 22;
const bit<32> CNT_NAK_SENT = 23;
const bit<32> CNT_HOP_RESENDS = 24;
const bit<32> CNT_DROP_BUFFER_BUSY = 25;
const bit<32> CNT_QP_ERRORS = 26;
const bit<32> CNT_DROP_QP_ERROR = 27;
const bit<32> CNT_RNR_NAK_SENT = 28;
const bit<32> CNT_RNR_NAK_RECEIVED = 29;
const bit<32> N_COUNTERS = 30;

/* Slot states (inagg.models.switch.SlotState). */
const bit<2> SLOT_FREE = 0;
const bit<2> SLOT_AGG = 1;
const bit<2> SLOT_DONE = 2;
const bit<2> SLOT_SENT = 3;  // trees only (docs/protocol.md section 10): a P4 switch runs alone and never enters it

header ethernet_h {
    bit<48> dst;
    bit<48> src;
    bit<16> ether_type;
}

header ipv4_h {
    bit<4>  version;
    bit<4>  ihl;
    bit<8>  tos;
    bit<16> total_len;
    bit<16> identification;
    bit<1>  flag_rsvd;
    bit<1>  flag_df;
    bit<1>  flag_mf;
    bit<13> frag_offset;
    bit<8>  ttl;
    bit<8>  protocol;
    bit<16> checksum;
    bit<32> src;
    bit<32> dst;
}

header udp_h {
    bit<16> sport;
    bit<16> dport;
    bit<16> len;
    bit<16> checksum;
}

header bth_h {
    bit<8>  opcode;
    bit<1>  se;
    bit<1>  migreq;
    bit<2>  pad;
    bit<4>  tver;
    bit<16> pkey;
    bit<8>  resv8a;
    bit<24> dqpn;
    bit<1>  ackreq;
    bit<7>  resv7;
    bit<24> psn;
}

header reth_h {
    bit<64> va;
    bit<32> rkey;
    bit<32> dma_len;
}

header immdt_h {
    bit<32> imm;
}

/* One INT32 lane, big-endian on the wire. */
header lane_h {
    bit<32> v;
}

/* The ICRC as it lies on the wire: the CRC-32 value least-significant byte first. */
header icrc_h {
    bit<32> wire;
}

/* P4 has no loops: INAGG_LANES_<n>(M) expands M(i) for every lane index i,
 * written as a hexadecimal literal (0x00, 0x01, ...) so that it can index a
 * header stack and name a per-lane register alike. */
#define INAGG_H16(M, h) M(h##0) M(h##1) M(h##2) M(h##3) M(h##4) M(h##5) M(h##6) M(h##7) \
                        M(h##8) M(h##9) M(h##a) M(h##b) M(h##c) M(h##d) M(h##e) M(h##f)
#define INAGG_LANES_32(M) INAGG_H16(M, 0x0) INAGG_H16(M, 0x1)
#define INAGG_LANES_64(M) INAGG_LANES_32(M) INAGG_H16(M, 0x2) INAGG_H16(M, 0x3)
#define INAGG_LANES_256(M) INAGG_LANES_64(M) \
    INAGG_H16(M, 0x4) INAGG_H16(M, 0x5) INAGG_H16(M, 0x6) INAGG_H16(M, 0x7) \
    INAGG_H16(M, 0x8) INAGG_H16(M, 0x9) INAGG_H16(M, 0xa) INAGG_H16(M, 0xb) \
    INAGG_H16(M, 0xc) INAGG_H16(M, 0xd) INAGG_H16(M, 0xe) INAGG_H16(M, 0xf)

/* The ICRC's masked view of IPv4, UDP and BTH (docs/protocol.md 1.8): the
 * variant fields replaced by ones. Shared by the check and the regeneration. */
#define INAGG_ICRC_HEADERS(h) \
    64w0xFFFFFFFFFFFFFFFF, \
    h.ipv4.version, h.ipv4.ihl, 8w0xFF, h.ipv4.total_len, h.ipv4.identification, \
    h.ipv4.flag_rsvd, h.ipv4.flag_df, h.ipv4.flag_mf, h.ipv4.frag_offset, 8w0xFF, \
    h.ipv4.protocol, 16w0xFFFF, h.ipv4.src, h.ipv4.dst, \
    h.udp.sport, h.udp.dport, h.udp.len, 16w0xFFFF, \
    h.bth.opcode, h.bth.se, h.bth.migreq, h.bth.pad, h.bth.tver, h.bth.pkey, 8w0xFF, \
    h.bth.dqpn, h.bth.ackreq, h.bth.resv7, h.bth.psn, \
    h.reth.va, h.reth.rkey, h.reth.dma_len

#endif
