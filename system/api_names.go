package system

import (
	"github.com/residency-go/residency/budget"
	"github.com/residency-go/residency/cuda"
)

// Names for the types that exported fields of this package carry, so that
// an application reads and writes every field while importing only
// system (and system/cache).
type (
	// AdmissionID is [BufferKey].Temporary's type: the admission a
	// temporary buffer belongs to.
	AdmissionID = budget.AdmissionID
	// ChargeState is [ChargeBusyError].State's type: the state of a
	// cache's charge as a victim.
	ChargeState = budget.ChargeState
	// Backend is [Options].Backend's type: the device backend the runtime
	// drives (the soft backend, a simulation, from [SoftBackend]; a real
	// one from package cuda).
	Backend = cuda.Backend
)
