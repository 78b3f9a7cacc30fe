//go:build linux

package soft

import (
	"encoding/binary"
	"os"
	"syscall"
	"unsafe"
)

// mapMemory returns n zero bytes in a private anonymous mapping that
// reserves no swap (MAP_NORESERVE): its pages are backed, and count in the
// process's resident set, only once written. Where the kernel refuses the
// mapping, Go memory; ok is false if neither can be had.
func mapMemory(n int64) (mem []byte, mapped, ok bool) {
	if n > 0 && n <= maxSlice {
		m, err := syscall.Mmap(-1, 0, int(n), syscall.PROT_READ|syscall.PROT_WRITE,
			syscall.MAP_PRIVATE|syscall.MAP_ANONYMOUS|syscall.MAP_NORESERVE)
		if err == nil {
			return m, true, true
		}
	}
	mem, ok = goMemory(n)
	return mem, false, ok
}

// maxSlice is the largest length a []byte may have on this platform.
const maxSlice = int64(^uint(0) >> 1)

// unmapMemory gives back a mapping made by mapMemory.
func unmapMemory(mem []byte) { _ = syscall.Munmap(mem) }

// dropPages zeroes p, page-aligned in a mapping, by giving its pages back
// to the kernel (MADV_DONTNEED: a private anonymous page reads as zero
// afterwards and is no longer resident). It reports false if the kernel
// refused, and the caller then clears p itself.
func dropPages(p []byte) bool {
	return len(p) == 0 || syscall.Madvise(p, syscall.MADV_DONTNEED) == nil
}

// pagemapPath is where the kernel tells a process about its pages.
var pagemapPath = "/proc/self/pagemap"

// Bits of a /proc/self/pagemap entry.
const (
	pagePresent = 1 << 63
	pageSwapped = 1 << 62
)

// touchedChunks calls visit(i) for each chunk i of mem (chunks of chunk
// bytes, the last possibly shorter) that skip(i) does not exclude and
// whose pages the process ever touched: resident (a written page, or the
// shared zero page of one only read) or swapped out, per
// /proc/self/pagemap. A chunk never touched is zero and is not visited.
// Where pagemap cannot be read, every chunk not skipped is visited.
func touchedChunks(mem []byte, chunk int64, skip func(i int) bool, visit func(i int)) {
	nchunks := int((int64(len(mem)) + chunk - 1) / chunk)
	f, err := os.Open(pagemapPath)
	if err != nil {
		visitAll(nchunks, skip, visit)
		return
	}
	defer f.Close()
	page := int64(os.Getpagesize())
	pagesPerChunk := chunk / page
	base := int64(uintptr(unsafe.Pointer(unsafe.SliceData(mem)))) / page
	entries := make([]byte, 8*pagesPerChunk*max(1, 8192/pagesPerChunk)) // whole chunks at a time
	for i := 0; i < nchunks; {
		if skip(i) {
			i++
			continue
		}
		// Read the entries of the chunks from i on that fit in entries.
		n := min(int64(len(entries))/8/pagesPerChunk, int64(nchunks-i))
		npages := min(n*pagesPerChunk, (int64(len(mem))+page-1)/page-int64(i)*pagesPerChunk)
		got, err := f.ReadAt(entries[:8*npages], 8*(base+int64(i)*pagesPerChunk))
		if err != nil || int64(got) != 8*npages {
			visitAll(nchunks-i, func(j int) bool { return skip(i + j) }, func(j int) { visit(i + j) })
			return
		}
		for c := range n {
			ci := i + int(c)
			if skip(ci) {
				continue
			}
			lo, hi := c*pagesPerChunk, min((c+1)*pagesPerChunk, npages)
			for p := lo; p < hi; p++ {
				if binary.NativeEndian.Uint64(entries[8*p:])&(pagePresent|pageSwapped) != 0 {
					visit(ci)
					break
				}
			}
		}
		i += int(n)
	}
}
