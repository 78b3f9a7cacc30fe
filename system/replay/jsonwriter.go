package replay

import (
	"bufio"
	"io"
	"strconv"
)

// JSONWriter writes results as JSON lines, one object per result, each
// written out (flushed) as soon as it is given: the output of
// `demo replay --json`.
type JSONWriter struct {
	w   *bufio.Writer
	buf []byte
}

// NewJSONWriter returns a writer of JSON lines to w.
func NewJSONWriter(w io.Writer) *JSONWriter { return &JSONWriter{w: bufio.NewWriterSize(w, 64<<10)} }

// Write writes r as one line.
func (j *JSONWriter) Write(r *Result) error {
	if r.Error == nil && r.Explanation == nil && r.Report == nil && r.Decision == nil && r.Snapshot == nil && r.Trace == nil &&
		r.Load == nil && r.Evicted == nil && r.Stats == nil && r.Staging == nil && r.TaskTransitions == nil {
		// The common case, written directly: what encoding/json would
		// write for it (op names need no escaping).
		b := append(j.buf[:0], `{"line":`...)
		b = strconv.AppendInt(b, int64(r.Line), 10)
		b = append(b, `,"op":"`...)
		b = append(b, r.Op...)
		b = append(b, `","ok":`...)
		b = strconv.AppendBool(b, r.OK)
		b = append(b, `,"state_version":`...)
		b = strconv.AppendUint(b, r.StateVersion, 10)
		b = append(b, "}\n"...)
		j.buf = b
		j.w.Write(b)
		return j.w.Flush()
	}
	b, err := Marshal(r)
	if err != nil {
		return err
	}
	j.w.Write(b)
	j.w.WriteByte('\n')
	return j.w.Flush()
}

// Flush writes out anything buffered.
func (j *JSONWriter) Flush() error { return j.w.Flush() }
