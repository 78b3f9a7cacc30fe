package replay

import (
	"context"
	"encoding/binary"

	"github.com/residency-go/residency/cuda"
)

// Fill writes the deterministic content of value name at offset off into
// dst. A value is a sequence of 4 KiB blocks of 8-byte little-endian
// words: word j of block b is base(j) XOR key(b), both mixes (SplitMix64's
// finalizer) of j or b with the FNV-1a hash of the name. So a replay
// produces the same bytes every time, every value and every block of a
// value has different bytes, and a value is filled at the speed of
// memory: one base block per call, then a load, a XOR and a store per
// word, with no allocation.
func Fill(name string, off int64, dst []byte) {
	seed := uint64(14695981039346656037) // FNV-1a offset basis
	for i := 0; i < len(name); i++ {
		seed ^= uint64(name[i])
		seed *= 1099511628211
	}
	word := func(w uint64) uint64 {
		return fillMix(seed, w%fillBlockWords) ^ fillMix(^seed, w/fillBlockWords)
	}
	i := 0
	// A head up to the first word boundary, byte by byte.
	for ; i < len(dst) && (off+int64(i))%8 != 0; i++ {
		pos := uint64(off + int64(i))
		dst[i] = byte(word(pos/8) >> (8 * (pos % 8)))
	}
	w := uint64(off+int64(i)) / 8
	if len(dst)-i >= 2*fillBlockWords*8 {
		// Long: the words up to a block boundary, then whole blocks from
		// the base block.
		for ; w%fillBlockWords != 0; w++ {
			binary.LittleEndian.PutUint64(dst[i:], word(w))
			i += 8
		}
		var base [fillBlockWords]uint64
		for j := range base {
			base[j] = fillMix(seed, uint64(j))
		}
		for ; len(dst)-i >= fillBlockWords*8; w += fillBlockWords {
			key := fillMix(^seed, w/fillBlockWords)
			blk := dst[i : i+fillBlockWords*8]
			for j := range base {
				binary.LittleEndian.PutUint64(blk[8*j:], base[j]^key)
			}
			i += fillBlockWords * 8
		}
	}
	for ; i+8 <= len(dst); i += 8 {
		binary.LittleEndian.PutUint64(dst[i:], word(w))
		w++
	}
	// A tail shorter than a word.
	if i < len(dst) {
		x := word(w)
		for j := 0; i < len(dst); i, j = i+1, j+1 {
			dst[i] = byte(x >> (8 * j))
		}
	}
}

// fillBlockWords is the number of words in a block of fill's content.
const fillBlockWords = 512

// fillMix is SplitMix64's output for state seed + (i+1)·γ.
func fillMix(seed, i uint64) uint64 {
	z := seed + (i+1)*0x9e3779b97f4a7c15
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}

// Loader returns the loader of a value named name registered with a
// source: it fills its buffer with Fill(name, 0, …).
func Loader(name string) cuda.Loader {
	return func(ctx context.Context, dst []byte) error {
		if err := ctx.Err(); err != nil {
			return err
		}
		Fill(name, 0, dst)
		return nil
	}
}
