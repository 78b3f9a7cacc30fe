package cluster

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
)

// cleanStopHandler passes protoactor's log records on, except that a
// record at error level whose error is [http.ErrServerClosed] is logged
// at info level: that is what the automanaged provider's health-check
// server returns when the node stops it on a clean shutdown, not a
// failure.
type cleanStopHandler struct{ slog.Handler }

func (h cleanStopHandler) Handle(ctx context.Context, r slog.Record) error {
	if r.Level >= slog.LevelError && recordHasCleanStop(r) {
		q := slog.NewRecord(r.Time, slog.LevelInfo, r.Message, r.PC)
		r.Attrs(func(a slog.Attr) bool {
			q.AddAttrs(a)
			return true
		})
		if !h.Handler.Enabled(ctx, slog.LevelInfo) {
			return nil
		}
		return h.Handler.Handle(ctx, q)
	}
	return h.Handler.Handle(ctx, r)
}

func recordHasCleanStop(r slog.Record) bool {
	clean := false
	r.Attrs(func(a slog.Attr) bool {
		if err, ok := a.Value.Resolve().Any().(error); ok && errors.Is(err, http.ErrServerClosed) {
			clean = true
			return false
		}
		return true
	})
	return clean
}

func (h cleanStopHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return cleanStopHandler{h.Handler.WithAttrs(as)}
}

func (h cleanStopHandler) WithGroup(name string) slog.Handler {
	return cleanStopHandler{h.Handler.WithGroup(name)}
}
