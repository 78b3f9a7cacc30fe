package main

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/residency-go/residency/system/replay"
)

// cacheDetail is the table's summary of a cache op's payload.
func cacheDetail(r *replay.Result) (string, bool) {
	switch {
	case r.Load != nil:
		what := "loaded"
		if r.Load.Hit {
			what = "hit"
		}
		s := fmt.Sprintf("%s %s, %s resident", what, strconv.Quote(r.Load.Key), bytesText(r.Load.Bytes))
		if r.Load.Warm {
			s += ", warm start from its demoted copy"
		}
		if r.Load.Lease != nil {
			s += ", lease " + strconv.Quote(*r.Load.Lease)
		} else {
			s += ", lease released"
		}
		return s, true
	case r.Evicted != nil:
		if *r.Evicted {
			return "evicted", true
		}
		return "not cached: nothing evicted", true
	case r.Stats != nil:
		st := r.Stats
		b := "no budget"
		if st.BudgetBytes != nil {
			b = "budget " + bytesText(*st.BudgetBytes)
		}
		out := fmt.Sprintf("%s %s: cache reserved %s, %d resources, %d evictions; location used %s reserved %s",
			st.Location, b, bytesText(st.ReservedBytes), st.Resources, st.Evictions,
			bytesText(st.LocationUsedBytes), bytesText(st.LocationReservedBytes))
		if st.Demotions+st.DemotionFailures+st.WarmStarts > 0 || st.Demoted > 0 {
			out += fmt.Sprintf("; spill: %d demoted copies kept (%s), %d demotions, %d failed, %d warm starts",
				st.Demoted, bytesText(st.DemotedBytes), st.Demotions, st.DemotionFailures, st.WarmStarts)
		}
		return out, true
	}
	return "", false
}

// stagingDetail is the table's summary of a staging op's payload and
// task transitions.
func stagingDetail(r *replay.Result) (string, bool) {
	var parts []string
	if s := r.Staging; s != nil {
		switch {
		case s.Step != nil:
			parts = append(parts, fmt.Sprintf("step %s in slot %d, %s", strconv.Quote(s.Step.Name), s.Step.Slot, bytesText(s.Step.Bytes)))
		case s.Row != nil:
			v := "mixed bytes"
			if s.Row.Value != nil {
				v = fmt.Sprintf("every byte %d", *s.Row.Value)
			}
			parts = append(parts, fmt.Sprintf("row (%s, %d): %s, %s", strconv.Quote(s.Row.Key), s.Row.Slot, bytesText(int64(s.Row.Bytes)), v))
		case s.State != nil:
			parts = append(parts, "task "+*s.State)
		case s.Stats != nil:
			st := s.Stats
			failure := ""
			if st.Failure != nil {
				failure = "; failed: " + *st.Failure
			}
			parts = append(parts, fmt.Sprintf("slots %d free of %d (%d holders, %d claims, %d waits); clones %s of %s (peak %s), %d flushes, drops %d (gpu-budget) %d (location-budget); tasks opened %d written %d failed %d; committed %s%s",
				st.FreeSlots, st.Slots, st.SlotHolders, st.SlotClaims, st.SlotWaits, bytesText(st.CloneBytes), bytesText(st.CloneBudgetBytes),
				bytesText(st.PeakCloneBytes), st.Flushes, st.Drops[0].Value, st.Drops[1].Value, st.Opened, st.Written, st.Failed,
				bytesText(st.CommittedBytes), failure))
		}
	}
	if len(r.TaskTransitions) > 0 {
		var ts []string
		for _, t := range r.TaskTransitions {
			from := "opened"
			if t.From != nil {
				from = *t.From
			}
			ts = append(ts, fmt.Sprintf("%s %s→%s", t.Task, from, t.To))
		}
		parts = append(parts, strings.Join(ts, ", "))
	}
	if len(parts) == 0 {
		return "", false
	}
	return strings.Join(parts, "; "), true
}
