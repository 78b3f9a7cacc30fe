package cluster

import (
	"errors"

	"github.com/residency-go/residency/budget"
	"github.com/residency-go/residency/messages/clusterpb"
	"github.com/residency-go/residency/system"
)

// Typed errors cross nodes as a clusterpb.RemoteError: the sender turns
// the error into its wire form (toRemote, placementToRemote) and the
// receiver rebuilds the same Go type (fromRemote, placementFromRemote), so
// that errors.As works across nodes as it does on one.

// toRemote turns an error into its wire form.
func toRemote(err error) *clusterpb.RemoteError {
	if err == nil {
		return nil
	}
	r := &clusterpb.RemoteError{Message: err.Error()}
	var (
		inv *budget.InvalidInputError
		un  *budget.UnavailableError
		be  *budget.BudgetError
		iu  *budget.InUseError
	)
	switch {
	case errors.As(err, &be):
		r.Kind = clusterpb.RemoteError_BUDGET
		r.Location, r.HasBudget, r.BudgetBytes, r.UsedBytes, r.ReservedBytes, r.RequestedBytes = be.Location, true, be.BudgetBytes, be.UsedBytes, be.ReservedBytes, be.RequestedBytes
	case errors.As(err, &iu):
		r.Kind = clusterpb.RemoteError_IN_USE
		r.Handle, r.Location = iu.Handle, iu.Location
		r.UseCount, r.HoldCount, r.PendingEventCount = int32(iu.UseCount), int32(iu.HoldCount), int32(iu.PendingEventCount)
	case errors.As(err, &un):
		r.Kind = clusterpb.RemoteError_UNAVAILABLE
		r.Handle, r.Location, r.Detail, r.Reason = un.Handle, un.Location, un.Detail, int32(un.Reason)
	case errors.As(err, &inv):
		r.Kind = clusterpb.RemoteError_INVALID_INPUT
		r.Message = inv.Message
	case errors.Is(err, system.ErrClosed):
		r.Kind = clusterpb.RemoteError_CLOSED
	}
	return r
}

// fromRemote turns a wire error back into the Go type it was sent as. A
// closed remote runtime is an [*system.UnavailableError] here (the local runtime
// is not closed).
func fromRemote(r *clusterpb.RemoteError) error {
	switch r.Kind {
	case clusterpb.RemoteError_BUDGET:
		return &budget.BudgetError{Location: r.Location, BudgetBytes: r.BudgetBytes, UsedBytes: r.UsedBytes, ReservedBytes: r.ReservedBytes, RequestedBytes: r.RequestedBytes}
	case clusterpb.RemoteError_IN_USE:
		return &budget.InUseError{Handle: r.Handle, Location: r.Location, UseCount: int(r.UseCount), HoldCount: int(r.HoldCount), PendingEventCount: int(r.PendingEventCount)}
	case clusterpb.RemoteError_UNAVAILABLE:
		return &budget.UnavailableError{Handle: r.Handle, Location: r.Location, Detail: r.Detail, Reason: budget.UnavailableReason(r.Reason)}
	case clusterpb.RemoteError_INVALID_INPUT:
		return &budget.InvalidInputError{Message: r.Message}
	case clusterpb.RemoteError_CLOSED:
		return &budget.UnavailableError{Reason: budget.UnavailableSource, Detail: "the remote runtime is closed: " + r.Message}
	}
	return errors.New(r.Message)
}

// placementToRemote is toRemote with the controller's errors too.
func placementToRemote(err error) *clusterpb.RemoteError {
	if err == nil {
		return nil
	}
	var (
		pe *budget.PlanExecutionError
		pl *budget.PlanError
		sl *budget.SearchLimitError
	)
	switch {
	case errors.As(err, &pe):
		return &clusterpb.RemoteError{Kind: clusterpb.RemoteError_PLAN_EXECUTION, Message: err.Error(), Detail: pe.Phase, Cause: placementToRemote(pe.Cause)}
	case errors.As(err, &sl):
		return &clusterpb.RemoteError{Kind: clusterpb.RemoteError_SEARCH_LIMIT, Message: err.Error(), Handle: sl.RequestName,
			RequestedBytes: int64(sl.StateLimit), UsedBytes: int64(sl.ExploredStates), Detail: sl.Detail}
	case errors.As(err, &pl):
		return &clusterpb.RemoteError{Kind: clusterpb.RemoteError_PLAN, Message: err.Error(), Detail: pl.Reason}
	}
	return toRemote(err)
}

func placementFromRemote(r *clusterpb.RemoteError) error {
	switch r.Kind {
	case clusterpb.RemoteError_PLAN:
		return &budget.PlanError{Reason: r.Detail}
	case clusterpb.RemoteError_SEARCH_LIMIT:
		return &budget.SearchLimitError{RequestName: r.Handle, StateLimit: int(r.RequestedBytes), ExploredStates: int(r.UsedBytes), Detail: r.Detail}
	case clusterpb.RemoteError_PLAN_EXECUTION:
		e := &budget.PlanExecutionError{Phase: r.Detail, FailedActionIndex: -1, FailedReservationIndex: -1}
		if r.Cause != nil {
			e.Cause = placementFromRemote(r.Cause)
		} else {
			e.Cause = errors.New(r.Message)
		}
		return e
	}
	return fromRemote(r)
}
