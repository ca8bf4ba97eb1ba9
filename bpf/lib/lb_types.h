/* lb_types.h — Service load-balancing maps, laid out as Cilium v1.16's
 * (bpf/lib/common.h and lb.h there). The agent (labkit/services.py) writes
 * them; bpf_lxc.c reads them for per-packet load balancing.
 *
 * Python mirrors these in labkit/maps/lb.py; tests/unit/test_layout.py
 * compares the compiled BTF. Keep in sync with that file.
 */
#ifndef LABKIT_LB_TYPES_H
#define LABKIT_LB_TYPES_H

/* lb4_service.flags */
#define SVC_FLAG_EXTERNAL_IP  0x01
#define SVC_FLAG_NODEPORT     0x02
#define SVC_FLAG_EXT_LOCAL_SCOPE 0x04
#define SVC_FLAG_HOSTPORT     0x08
#define SVC_FLAG_AFFINITY     0x10
#define SVC_FLAG_LOADBALANCER 0x20
#define SVC_FLAG_ROUTABLE     0x40
#define SVC_FLAG_SOURCE_RANGE 0x80
/* lb4_service.flags2 */
#define SVC_FLAG_LOCALREDIRECT  0x01
#define SVC_FLAG_NAT_46X64      0x02
#define SVC_FLAG_L7LOADBALANCER 0x04
#define SVC_FLAG_LOOPBACK       0x08 /* hostPort on a loopback address (not hairpin) */
#define SVC_FLAG_INT_LOCAL_SCOPE 0x10
#define SVC_FLAG_TWO_SCOPES     0x20

/* lb4_key.scope */
#define LB_LOOKUP_SCOPE_EXT 0
#define LB_LOOKUP_SCOPE_INT 1

/* lb4_backend.flags: the backend's state */
#define BE_STATE_ACTIVE      0
#define BE_STATE_TERMINATING 1
#define BE_STATE_QUARANTINED 2
#define BE_STATE_MAINTENANCE 3

struct lb4_key {
	__be32 address;      /* service VIP */
	__be16 dport;        /* service port */
	__u16 backend_slot;  /* 0: the service head; 1..count: backends */
	__u8 proto;          /* L4 protocol */
	__u8 scope;          /* LB_LOOKUP_SCOPE_* */
	__u8 pad[2];
};

struct lb4_service {
	__u32 backend_id;    /* slots 1..: the backend; slot 0: session affinity timeout (s) */
	__u16 count;         /* slot 0: number of active backends */
	__be16 rev_nat_index; /* slot 0: the service id, network byte order */
	__u8 flags;          /* SVC_FLAG_* */
	__u8 flags2;
	__u8 pad[2];
};

struct lb4_backend {
	__be32 address;
	__be16 port;
	__u8 proto;
	__u8 flags;          /* BE_STATE_* */
	__u16 cluster_id;
	__u8 zone;
	__u8 pad;
};

struct lb4_reverse_nat {
	__be32 address;
	__be16 port;
} __attribute__((packed));

/* Session affinity: client → backend, per service. */
struct lb4_affinity_key {
	__u64 client_id;     /* client IPv4 address (be32) in the low bytes, or a socket cookie */
	__u16 rev_nat_id;
	__u8 netns_cookie;   /* 1: client_id is a netns cookie (socket LB) */
	__u8 pad1;
	__u32 pad2;
} __attribute__((packed));

struct lb_affinity_val {
	__u64 last_used;     /* lab clock second of the last use */
	__u32 backend_id;
	__u32 pad;
} __attribute__((packed));

/* Session affinity's check that the remembered backend still belongs to the
 * service: the agent writes one key per (service id, backend) of every service
 * with affinity, and removes it with the backend (Cilium's
 * cilium_lb_affinity_match, bpf/lib/common.h struct lb_affinity_match). */
struct lb_affinity_match {
	__u32 backend_id;
	__be16 rev_nat_id;   /* the service id, network byte order as in lb4_service */
	__u16 pad;
} __attribute__((packed));

/* Socket LB: what connect() rewrote, so getpeername() can show the VIP. */
struct ipv4_revnat_tuple {
	__u64 cookie;        /* socket cookie */
	__be32 address;      /* backend address */
	__be16 port;         /* backend port */
	__u16 pad;
} __attribute__((packed));

struct ipv4_revnat_entry {
	__be32 address;      /* service VIP */
	__be16 port;
	__u16 rev_nat_index;
} __attribute__((packed));

/* Maglev: one table of backend ids per service id (Cilium's inner map of
 * cilium_lb4_maglev: an array with one element, the whole table). Its size M
 * is a lab option, one of Cilium's primes (labkit/maglev.py). */
#ifndef LB_MAGLEV_LUT_SIZE
#define LB_MAGLEV_LUT_SIZE 251
#endif

struct lb4_maglev_lut {
	__u32 backend_ids[LB_MAGLEV_LUT_SIZE];
};

#endif /* LABKIT_LB_TYPES_H */
