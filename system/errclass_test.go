package system

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
)

// TestErrorClass: the outermost classified error of the chain gives the
// class; each class has its stable name and Go type name.
func TestErrorClass(t *testing.T) {
	budgetErr := &BudgetError{Location: "cuda:0"}
	for _, c := range []struct {
		err      error
		want     ErrorKind
		name     string
		typeName string
	}{
		{nil, ErrorOther, "Error", ""},
		{errors.New("x"), ErrorOther, "Error", ""},
		{context.DeadlineExceeded, ErrorOther, "Error", ""},
		{ErrClosed, ErrorOther, "Error", ""},
		{&FatalError{}, ErrorOther, "Error", ""},
		{budgetErr, ErrorBudget, "ResidencyBudgetError", "BudgetError"},
		{fmt.Errorf("wrapped: %w", budgetErr), ErrorBudget, "ResidencyBudgetError", "BudgetError"},
		{&PlanError{}, ErrorPlan, "ResidencyPlanError", "PlanError"},
		{&SearchLimitError{}, ErrorSearchLimit, "ResidencySearchLimitError", "SearchLimitError"},
		{&StaleStateError{}, ErrorStaleState, "ResidencyStaleStateError", "StaleStateError"},
		{&InUseError{}, ErrorInUse, "ResidencyInUseError", "InUseError"},
		{&UnavailableError{}, ErrorUnavailable, "ResidencyUnavailableError", "UnavailableError"},
		{&PlanExecutionError{Cause: budgetErr}, ErrorPlanExecution, "ResidencyPlanExecutionError", "PlanExecutionError"},
		{&InvalidInputError{}, ErrorInvalidInput, "InvalidInput", "InvalidInputError"},
		{&CacheBusyError{Refusal: budgetErr}, ErrorCacheBusy, "ResidencyCacheBusyError", "CacheBusyError"},
		{&CacheLoadError{Cause: budgetErr}, ErrorCacheLoad, "ResidencyCacheLoadError", "CacheLoadError"},
		{classed{ErrorStaleState}, ErrorStaleState, "ResidencyStaleStateError", "StaleStateError"},
	} {
		got := ErrorClass(c.err)
		assert.Equal(t, c.want, got, "%v", c.err)
		assert.Equal(t, c.name, got.String())
		assert.Equal(t, c.typeName, got.TypeName())
	}
	assert.Equal(t, "Error", ErrorKind(200).String())
	assert.Len(t, ErrorKinds(), int(numErrorKinds))
}

// ClassifiedError returns the error of the chain that has the class.
func TestClassifiedError(t *testing.T) {
	pe := &PlanExecutionError{Cause: &BudgetError{}}
	k, e := ClassifiedError(fmt.Errorf("run: %w", pe))
	assert.Equal(t, ErrorPlanExecution, k)
	assert.Same(t, pe, e)
	other := errors.New("x")
	k, e = ClassifiedError(other)
	assert.Equal(t, ErrorOther, k)
	assert.Equal(t, other, e)
}

type classed struct{ k ErrorKind }

func (c classed) Error() string         { return "classed" }
func (c classed) ErrorClass() ErrorKind { return c.k }
