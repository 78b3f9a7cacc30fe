package nodeproc

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/residency-go/residency/system"
)

// TestPattern: the pattern made piece by piece is the pattern made whole,
// and a size ≤ 0 is no bytes (no makeslice panic).
func TestPattern(t *testing.T) {
	whole := Pattern(42, 10_000)
	ps := NewPatternStream(42)
	var pieces []byte
	for _, n := range []int{1, 0, 999, 4096, 4904} {
		b := make([]byte, n)
		ps.Fill(b)
		pieces = append(pieces, b...)
	}
	assert.Equal(t, whole, pieces)
	assert.NotEqual(t, whole, Pattern(43, 10_000))
	assert.Nil(t, Pattern(1, 0))
	assert.Nil(t, Pattern(1, -5))
}

// TestErrorType names the runtime's error types without Go's package
// prefix, wrapped or not.
func TestErrorType(t *testing.T) {
	for _, c := range []struct {
		err  error
		want string
	}{
		{&system.BudgetError{}, "BudgetError"},
		{fmt.Errorf("x: %w", &system.InvalidInputError{}), "InvalidInputError"},
		{&system.UnavailableError{}, "UnavailableError"},
		{context.DeadlineExceeded, "DeadlineExceeded"},
		{&system.PlanExecutionError{}, "PlanExecutionError"},
		{&system.PlanError{}, "PlanError"},
		{&system.InUseError{}, "InUseError"},
		{&system.StaleStateError{}, "StaleStateError"},
		{&system.SearchLimitError{}, "SearchLimitError"},
		{errors.New("x"), "*errors.errorString"},
	} {
		assert.Equal(t, c.want, ErrorType(c.err), "%v", c.err)
	}
}

// A placement that every node refused, each attempt with an unavailable
// value, names the unavailable error found through the joined attempts
// (the kill tests read it so), not the placement.
func TestErrorTypeThroughJoinedAttempts(t *testing.T) {
	attempts := errors.Join(
		fmt.Errorf("node-a: %w", &system.UnavailableError{Handle: "wq", Detail: "no value named wq"}),
		fmt.Errorf("node-b: %w", &system.UnavailableError{Handle: "wq", Detail: "no value named wq"}),
	)
	assert.Equal(t, "UnavailableError", ErrorType(fmt.Errorf("placement refused: %w", attempts)))
	assert.Equal(t, "BudgetError", ErrorType(errors.Join(errors.New("x"), &system.BudgetError{Location: "cuda:0"})))
	assert.Equal(t, "PlanError", ErrorType(fmt.Errorf("w: %w", &system.PlanError{Reason: "r"})))
}
