package placement

import "hash/maphash"

// BlockSize is the bytes of prompt per block of a chain: about 64 tokens.
const BlockSize = 256

// seed is this process's block-hash seed: the prefix index is each
// process's own, so its hashes need not agree with another's.
var seed = maphash.MakeSeed()

// Chain appends to dst[:0] the chain of block hashes of prompt: one hash
// per full BlockSize block, each mixed with the previous block's, so two
// prompts share a chain exactly as long as they share whole leading blocks.
// A trailing partial block is left out. With cap(dst) ≥ len(prompt)/
// BlockSize it allocates nothing.
func Chain(dst []uint64, prompt []byte) []uint64 {
	dst = dst[:0]
	var prev uint64
	for len(prompt) >= BlockSize {
		prev = mix(prev ^ maphash.Bytes(seed, prompt[:BlockSize]))
		dst = append(dst, prev)
		prompt = prompt[BlockSize:]
	}
	return dst
}

// ChainParts is Chain over the concatenation of parts, without
// concatenating them: a block may straddle two parts. Like Chain, it
// allocates nothing when cap(dst) is enough.
func ChainParts(dst []uint64, parts ...[]byte) []uint64 {
	dst = dst[:0]
	var prev uint64
	var block [BlockSize]byte
	n := 0 // bytes of block filled
	for _, p := range parts {
		if n > 0 {
			k := copy(block[n:], p)
			n += k
			p = p[k:]
			if n < BlockSize {
				continue
			}
			prev = mix(prev ^ maphash.Bytes(seed, block[:]))
			dst = append(dst, prev)
			n = 0
		}
		for len(p) >= BlockSize {
			prev = mix(prev ^ maphash.Bytes(seed, p[:BlockSize]))
			dst = append(dst, prev)
			p = p[BlockSize:]
		}
		n = copy(block[:], p)
	}
	return dst
}

// HashString is a stable 64-bit hash of s (FNV-1a 64 with the splitmix64
// finaliser): the same in every process, for member ids and affinity keys
// (a pin shared in Redis, a member's sticky rank across a reload).
func HashString(s string) uint64 {
	h := uint64(14695981039346656037)
	for i := 0; i < len(s); i++ {
		h ^= uint64(s[i])
		h *= 1099511628211
	}
	return mix(h)
}

// mix is the splitmix64 finaliser: every input bit moves every output bit,
// which FNV-1a alone does not do for its high bits.
func mix(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}

// HashBytes is HashString(string(b)) without the conversion.
func HashBytes(b []byte) uint64 {
	h := uint64(14695981039346656037)
	for _, c := range b {
		h ^= uint64(c)
		h *= 1099511628211
	}
	return mix(h)
}
