/* hash.h — the kernel's jhash_3words (include/linux/jhash.h), which Cilium
 * uses to hash a flow onto its Maglev table. labkit/maglev.py computes the
 * same function, so a notebook can say which slot a flow will read.
 */
#ifndef LABKIT_HASH_H
#define LABKIT_HASH_H

#define JHASH_INITVAL 0xdeadbeef

/* Seed of the flow hash (Cilium: from --bpf-lb-maglev-hash-seed); the same on every node. */
#ifndef LB_FLOW_HASH_SEED
#define LB_FLOW_HASH_SEED 0
#endif

static __always_inline __u32 lk_rol32(__u32 word, unsigned int shift)
{
	return (word << shift) | (word >> ((-shift) & 31));
}

static __always_inline __u32 jhash_3words(__u32 a, __u32 b, __u32 c, __u32 initval)
{
	a += initval + JHASH_INITVAL + (3 << 2);
	b += initval + JHASH_INITVAL + (3 << 2);
	c += initval + JHASH_INITVAL + (3 << 2);
	c ^= b; c -= lk_rol32(b, 14);
	a ^= c; a -= lk_rol32(c, 11);
	b ^= a; b -= lk_rol32(a, 25);
	c ^= b; c -= lk_rol32(b, 16);
	a ^= c; a -= lk_rol32(c, 4);
	b ^= a; b -= lk_rol32(a, 14);
	c ^= b; c -= lk_rol32(b, 24);
	return c;
}

#endif /* LABKIT_HASH_H */
