package nodeproc

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/residency-go/residency/internal/jsonline"
	"github.com/residency-go/residency/system/replay"
)

// FuzzDurationFields feeds any JSON number to every duration field of the
// project's inputs: jsonline's OptMillis (the one reader of millisecond
// fields), a node command's timeout_ms and a replay script's
// claim_timeout_ms (staging_start). Each accepts exactly the integers 0
// to jsonline.MaxMillis, reads them to that many milliseconds, and
// refuses anything else with a message naming the field (a value such as
// 2^63−1 never wraps to a negative duration).
//
//	go test -run '^$' -fuzz '^FuzzDurationFields$' -fuzztime 60s ./internal/nodeproc/
func FuzzDurationFields(f *testing.F) {
	for _, s := range []string{"0", "1", "86400000", "86400001", "-1", "-0", "9223372036854775807",
		"9223372036854775808", "9.3e12", "1e3", "1.5", "1e300", "-9223372036854775808", "0.0", "100E-2"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, num string) {
		if len(num) > 64 || strings.ContainsAny(num, "\"\\{}[],:\n\r") {
			return
		}
		v, err := jsonline.Parse([]byte(`{"d_ms":` + num + `}`))
		if err != nil {
			return // not JSON at all
		}
		if x, _ := v.Get("d_ms"); x.Kind != jsonline.Number {
			return // a string, an array: "want an integer", not a duration
		}
		x, _ := v.Get("d_ms")
		n, p := jsonline.ParseInt(x.Text)
		inRange := p == jsonline.NumberOK && n >= 0 && n <= jsonline.MaxMillis

		// The helper itself.
		fl := &jsonline.Fields{Obj: &v}
		d := fl.OptMillis("d_ms", "none")
		if inRange != (fl.Err == nil) {
			t.Fatalf("OptMillis(%s): in range %v, error %v", num, inRange, fl.Err)
		}
		if inRange && (d == nil || *d != time.Duration(n)*time.Millisecond || *d < 0) {
			t.Fatalf("OptMillis(%s) = %v, want %d ms", num, d, n)
		}
		if !inRange && !strings.Contains(fl.Err.Error(), `"d_ms"`) {
			t.Fatalf("OptMillis(%s): the error does not name the field: %v", num, fl.Err)
		}

		// A node command's timeout_ms.
		cmd, err := parseCommand([]byte(`{"id":1,"op":"members","timeout_ms":` + num + `}`))
		if inRange != (err == nil) {
			t.Fatalf("timeout_ms %s: in range %v, error %v", num, inRange, err)
		}
		if inRange && cmd.TimeoutMS != n {
			t.Fatalf("timeout_ms %s read as %d", num, cmd.TimeoutMS)
		}
		if !inRange && !strings.Contains(err.Error(), `"timeout_ms"`) {
			t.Fatalf("timeout_ms %s: the error does not name the field: %v", num, err)
		}

		// A replay script's claim_timeout_ms.
		script := `{"op":"start","locations":{"pageable-host":null,"pinned-host":null,"cuda:0":"64KiB"}}` + "\n" +
			fmt.Sprintf(`{"op":"staging_start","name":"p","device":"cuda:0","slots":1,"slot_bytes":512,"claim_timeout_ms":%s,"keys":["k"],"pool_slots":1,"row_bytes":512}`, num) + "\n"
		_, err = replay.Parse(strings.NewReader(script))
		if inRange != (err == nil) {
			t.Fatalf("claim_timeout_ms %s: in range %v, error %v", num, inRange, err)
		}
		if !inRange && !strings.Contains(err.Error(), `"claim_timeout_ms"`) {
			t.Fatalf("claim_timeout_ms %s: the error does not name the field: %v", num, err)
		}
	})
}
