package budget

import "strconv"

// victimReason is an eviction's Reason for a value victim: its priority
// and last use, where it is, what happens to it (what: "evicted" or
// "demoted to T"), the bytes it frees of the shortfall, and the request.
// Built with strconv: the decision of every admission that evicts makes
// one per victim.
func victimReason(prio int64, lastUse uint64, at, what string, bytes, shortfall int64, request string) string {
	b := make([]byte, 0, 160+len(at)+len(what)+len(request))
	b = append(b, "priority H="...)
	b = strconv.AppendInt(b, prio, 10)
	b = append(b, " (last use v"...)
	b = strconv.AppendUint(b, lastUse, 10)
	b = append(b, ") among the lowest at "...)
	b = append(b, at...)
	b = append(b, "; "...)
	b = append(b, what...)
	b = append(b, " to free "...)
	b = strconv.AppendInt(b, bytes, 10)
	b = append(b, " bytes of the "...)
	b = strconv.AppendInt(b, shortfall, 10)
	b = append(b, "-byte shortfall for request "...)
	b = strconv.AppendQuote(b, request)
	return string(b)
}

// roomForReason is what a victim chosen at a spill target adds to its
// Reason: the demotion it makes room for and that demotion's reclaim
// index.
func roomForReason(at, demoted, from string, reclaim int) string {
	b := make([]byte, 0, 96+len(at)+len(demoted)+len(from))
	b = append(b, ", at "...)
	b = append(b, at...)
	b = append(b, " to make room for the demotion of "...)
	b = append(b, demoted...)
	b = append(b, " from "...)
	b = append(b, from...)
	b = append(b, " (reclaim "...)
	b = strconv.AppendInt(b, int64(reclaim), 10)
	b = append(b, ')')
	return string(b)
}
