// Package stagingscript writes random replay scripts that drive the
// write pipeline of package staging (docs/replay.md, "The write
// pipeline"): the inputs of the tests that replay a script several times
// and require the same output. No user of the module can import it.
package stagingscript

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
)

// Random writes a random staging script: one pipeline (eager or not),
// steps, tasks of both join modes, freeze events held open (a freeze often
// releases several copy stages at once), appends (some refused, dropped or
// flushing), submits and prioritizes of one task or several, waits, reads,
// faults, snapshots, and a close. It ends with a snapshot and the trace,
// which show every location's peak and the order of every charge and
// release of the whole script.
func Random(rng *rand.Rand) string {
	var b strings.Builder
	pinned := "null"
	if rng.IntN(3) == 0 {
		pinned = `"24KiB"`
	}
	fmt.Fprintf(&b, `{"op":"start","locations":{"pageable-host":null,"pinned-host":%s,"cuda:0":"%dKiB"}}`+"\n", pinned, 2+rng.IntN(6))
	eager := rng.IntN(5) == 0
	fmt.Fprintf(&b, `{"op":"staging_start","name":"p","device":"cuda:0","slots":%d,"slot_bytes":"1KiB","keys":["k","v"],"pool_slots":4,"row_bytes":256,"clone_budget":"%dKiB","eager":%v}`+"\n",
		1+rng.IntN(3), 1+rng.IntN(2), eager)
	var steps, tasks, events []string
	pick := func(xs []string, fresh string) string {
		if len(xs) == 0 || rng.IntN(6) == 0 {
			return fresh
		}
		return xs[rng.IntN(len(xs))]
	}
	freeze := func() string {
		if eager || rng.IntN(3) != 0 {
			return ""
		}
		e := pick(events, fmt.Sprint("f", len(events)))
		if !slices.Contains(events, e) {
			events = append(events, e)
		}
		return fmt.Sprintf(`,"freeze":%q`, e)
	}
	rows := func(size int) string {
		var rs []string
		for range 1 + rng.IntN(2) {
			off := 0
			if size >= 256 {
				off = 256 * rng.IntN(size/256)
			}
			rs = append(rs, fmt.Sprintf(`{"key":%q,"slot":%d,"offset":%d}`, []string{"k", "v"}[rng.IntN(2)], rng.IntN(4), off))
		}
		return "[" + strings.Join(rs, ",") + "]"
	}
	// some names one task or several (the replay submits them in order).
	some := func(xs []string) string {
		names := []string{fmt.Sprintf("%q", pick(xs, "t0"))}
		for len(xs) > 1 && rng.IntN(3) == 0 {
			names = append(names, fmt.Sprintf("%q", xs[rng.IntN(len(xs))]))
		}
		return strings.Join(names, ",")
	}
	n := 20 + rng.IntN(40)
	for range n {
		switch x := rng.IntN(100); {
		case x < 12:
			s := fmt.Sprint("s", len(steps))
			steps = append(steps, s)
			fmt.Fprintf(&b, `{"op":"stage","pipeline":"p","step":%q,"bytes":%d,"fill":%d%s}`+"\n", s, 256*rng.IntN(5), rng.IntN(200), freeze())
		case x < 18:
			fmt.Fprintf(&b, `{"op":"step_release","step":%q}`+"\n", pick(steps, "s0"))
		case x < 26:
			if len(events) > 0 {
				fmt.Fprintf(&b, `{"op":"freeze","event":%q}`+"\n", events[rng.IntN(len(events))])
				if rng.IntN(2) == 0 {
					b.WriteString(`{"op":"snapshot"}` + "\n")
				}
			}
		case x < 36:
			tk := fmt.Sprint("t", len(tasks))
			tasks = append(tasks, tk)
			fmt.Fprintf(&b, `{"op":"task_open","pipeline":"p","task":%q,"req":"r","mode":%q}`+"\n", tk, []string{"next_step", "on_finish"}[rng.IntN(2)])
		case x < 58:
			tk := pick(tasks, "t0")
			if rng.IntN(2) == 0 {
				fmt.Fprintf(&b, `{"op":"append","task":%q,"step":%q,"rows":%s}`+"\n", tk, pick(steps, "s0"), rows(1024))
			} else {
				size := 256 * (1 + rng.IntN(3))
				fmt.Fprintf(&b, `{"op":"append","task":%q,"device_bytes":%d,"fill":%d%s,"no_wait":%v,"rows":%s}`+"\n", tk, size, rng.IntN(200), freeze(), rng.IntN(3) == 0, rows(size))
			}
		case x < 68:
			fmt.Fprintf(&b, `{"op":"submit","tasks":[%s]}`+"\n", some(tasks))
		case x < 74:
			fmt.Fprintf(&b, `{"op":"prioritize","tasks":[%s]}`+"\n", some(tasks))
		case x < 80:
			fmt.Fprintf(&b, `{"op":"wait","task":%q,"until":%q}`+"\n", pick(tasks, "t0"), []string{"host_ready", "written"}[rng.IntN(2)])
		case x < 87:
			fmt.Fprintf(&b, `{"op":"read_row","task":%q,"key":%q,"slot":%d}`+"\n", pick(tasks, "t0"), []string{"k", "v"}[rng.IntN(2)], rng.IntN(4))
		case x < 90:
			fmt.Fprintf(&b, `{"op":"read_pool","pipeline":"p","key":"k","slot":%d}`+"\n", rng.IntN(4))
		case x < 94:
			b.WriteString(`{"op":"staging_stats","pipeline":"p"}` + "\n")
		case x < 97:
			k := [][2]string{{"copy", "pinned-host"}, {"copy", "cuda:0"}, {"reconstruct", "pinned-host"}}[rng.IntN(3)]
			fmt.Fprintf(&b, `{"op":"fail_next","kind":%q,"location":%q}`+"\n", k[0], k[1])
		default:
			b.WriteString(`{"op":"snapshot"}` + "\n")
		}
	}
	if rng.IntN(2) == 0 {
		b.WriteString(`{"op":"staging_close","pipeline":"p"}` + "\n")
	}
	b.WriteString(`{"op":"staging_stats","pipeline":"p"}` + "\n")
	b.WriteString(`{"op":"snapshot"}` + "\n" + `{"op":"trace"}` + "\n")
	return b.String()
}

// Freezes writes a random script of the kind whose output depends on the
// order in which the pipeline's goroutines run unless the pipeline runs
// one task at a time (staging.Config.Serial): rounds of tasks of both join
// modes whose copies wait for a few freeze events, submitted or
// prioritized together, so that one freeze releases several copy stages
// at once; clones under budget pressure (flushes), a pinned budget that
// landing buffers may fill, a rare fault, a snapshot after each freeze.
// It ends with every event completed, a snapshot, the close, a snapshot
// and the trace.
func Freezes(rng *rand.Rand) string {
	var b strings.Builder
	line := func(format string, args ...any) { fmt.Fprintf(&b, format+"\n", args...) }
	pinned := "null"
	if rng.IntN(3) == 0 {
		pinned = fmt.Sprintf(`"%dKiB"`, 3+rng.IntN(3)) // 2 KiB of slots, the rest for landing buffers
	}
	line(`{"op":"start","locations":{"pageable-host":null,"pinned-host":%s,"cuda:0":"%dKiB"}}`, pinned, 8+rng.IntN(9))
	line(`{"op":"staging_start","name":"p","device":"cuda:0","slots":2,"slot_bytes":"1KiB","keys":["k","v"],"pool_slots":4,"row_bytes":256,"clone_budget":"%dKiB"}`, 2+rng.IntN(3))
	var events, open []string
	frozen := map[string]bool{}
	step, steps, tasks, rows := "", 0, 0, 0
	event := func() string {
		if len(events) > 0 && rng.IntN(3) != 0 {
			return events[rng.IntN(len(events))]
		}
		e := fmt.Sprint("f", len(events))
		events = append(events, e)
		return e
	}
	row := func() string {
		rows++
		return fmt.Sprintf(`{"key":%q,"slot":%d}`, []string{"k", "v"}[rows%2], rows/2%4)
	}
	for range 2 + rng.IntN(4) {
		if rng.IntN(2) == 0 {
			if step != "" {
				line(`{"op":"step_release","step":%q}`, step)
			}
			step = fmt.Sprint("s", steps)
			steps++
			freeze := ""
			if rng.IntN(2) == 0 {
				freeze = fmt.Sprintf(`,"freeze":%q`, event())
			}
			line(`{"op":"stage","pipeline":"p","step":%q,"bytes":1024,"fill":%d%s}`, step, rng.IntN(200), freeze)
		}
		var round []string
		for range 2 + rng.IntN(3) {
			t := fmt.Sprint("t", tasks)
			tasks++
			mode := "on_finish"
			if step != "" && rng.IntN(3) == 0 {
				mode = "next_step"
			}
			line(`{"op":"task_open","pipeline":"p","task":%q,"req":"r","mode":%q}`, t, mode)
			for range 1 + rng.IntN(2) {
				if mode == "next_step" {
					line(`{"op":"append","task":%q,"step":%q,"rows":[{"key":"k","slot":%d,"offset":%d}]}`, t, step, rng.IntN(4), 256*rng.IntN(4))
					continue
				}
				freeze := ""
				if rng.IntN(2) == 0 {
					freeze = fmt.Sprintf(`,"freeze":%q`, event())
				}
				line(`{"op":"append","task":%q,"device_bytes":%d,"fill":%d%s,"no_wait":%v,"rows":[%s]}`, t, 256*(1+rng.IntN(3)), rng.IntN(200), freeze, rng.IntN(4) == 0, row())
			}
			round = append(round, fmt.Sprintf("%q", t))
		}
		if rng.IntN(8) == 0 {
			k := [][2]string{{"copy", "pinned-host"}, {"copy", "cuda:0"}, {"reconstruct", "pinned-host"}}[rng.IntN(3)]
			line(`{"op":"fail_next","kind":%q,"location":%q}`, k[0], k[1])
		}
		rng.Shuffle(len(round), func(i, j int) { round[i], round[j] = round[j], round[i] })
		cut := rng.IntN(len(round) + 1)
		if cut > 0 {
			line(`{"op":"submit","tasks":[%s]}`, strings.Join(round[:cut], ","))
		}
		if cut < len(round) && rng.IntN(2) == 0 {
			line(`{"op":"prioritize","tasks":[%s]}`, strings.Join(round[cut:], ","))
		} else {
			open = append(open, round[cut:]...)
		}
		if len(events) > 0 && rng.IntN(3) != 0 {
			e := events[rng.IntN(len(events))]
			frozen[e] = true
			line(`{"op":"freeze","event":%q}`, e)
			line(`{"op":"snapshot"}`)
		}
	}
	if len(open) > 0 && rng.IntN(2) == 0 {
		line(`{"op":"submit","tasks":[%s]}`, strings.Join(open, ","))
	}
	for _, e := range events {
		if !frozen[e] {
			line(`{"op":"freeze","event":%q}`, e)
		}
	}
	line(`{"op":"snapshot"}`)
	line(`{"op":"staging_close","pipeline":"p"}`)
	line(`{"op":"staging_stats","pipeline":"p"}`)
	line(`{"op":"snapshot"}`)
	line(`{"op":"trace"}`)
	return b.String()
}
