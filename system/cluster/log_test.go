package cluster

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"testing"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/assert"
)

// TestCleanStopHandler: protoactor's automanaged
// provider logs its health server's http.ErrServerClosed at error level
// when a node stops cleanly ("Automanaged server stopping..!" with
// "http: Server closed"); the node's log says it at info level. Any other
// error stays an error.
func TestCleanStopHandler(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(cleanStopHandler{zerolog.NewSlogHandler(zerolog.New(&buf))}).With("component", "protoactor-cluster")
	log.Error("Automanaged server stopping..!", slog.Any("error", http.ErrServerClosed))
	assert.Contains(t, buf.String(), `"level":"info"`)
	assert.Contains(t, buf.String(), `"error":"http: Server closed"`)
	assert.Contains(t, buf.String(), `"component":"protoactor-cluster"`)
	assert.NotContains(t, buf.String(), `"level":"error"`)

	buf.Reset()
	log.Error("Automanaged server stopping..!", slog.Any("error", fmt.Errorf("listen: %w", errors.New("address in use"))))
	assert.Contains(t, buf.String(), `"level":"error"`)

	buf.Reset()
	quiet := slog.New(cleanStopHandler{zerolog.NewSlogHandler(zerolog.New(&buf).Level(zerolog.WarnLevel))})
	quiet.Error("Automanaged server stopping..!", slog.Any("error", http.ErrServerClosed))
	assert.Empty(t, buf.String(), "an info line below the logger's level is dropped")
}
