package offload

// Report is what a run found (`demo offload --json` prints it as JSON).
type Report struct {
	Simulation       string           `json:"simulation"`
	Trace            string           `json:"trace"`
	Requests         int              `json:"requests"`
	TraceSeconds     float64          `json:"trace_seconds"`
	Speed            float64          `json:"speed"`
	WallSeconds      float64          `json:"wall_seconds"`
	BytesPerToken    int64            `json:"bytes_per_token"`
	StandsForPerTok  int64            `json:"stands_for_bytes_per_token"`
	Scale            int64            `json:"scale"`
	Tokens           int64            `json:"tokens"`
	KVBytes          int64            `json:"kv_bytes"`
	OffloadedBytes   int64            `json:"offloaded_bytes"`
	DroppedBytes     int64            `json:"dropped_bytes"`
	TasksOpened      int64            `json:"tasks_opened"`
	TasksWritten     int64            `json:"tasks_written"`
	TasksFailed      int64            `json:"tasks_failed"`
	AppendsRefused   int64            `json:"appends_refused"`
	Flushes          int64            `json:"budget_flushes"`
	Drops            map[string]int64 `json:"drops"`
	PeakCloneBytes   int64            `json:"peak_clone_bytes"`
	CloneBudgetBytes int64            `json:"clone_budget_bytes"`
	Budgets          []BudgetPeak     `json:"budgets"`
	Samples          int              `json:"samples"`
	BudgetViolations int              `json:"budget_violations"`
	MaxQueue         map[string]int   `json:"max_queue"`
	Queue            []QueueSample    `json:"queue"`

	// BehindSeconds: how much longer than the trace's span on the run's
	// clock (TraceSeconds / Speed) the run took: the backlog drained after
	// the last arrival. LiveAtLastArrival: the tasks not yet written when
	// the last request arrived. CPUSeconds: the process's CPU time (user +
	// system) over the run, -1 if unknown; far below WallSeconds on a run
	// that is behind, the run waited (for a CPU on a busy machine, or for
	// the copy path's round trips), it did not compute.
	BehindSeconds     float64 `json:"behind_seconds"`
	LiveAtLastArrival int     `json:"live_tasks_at_last_arrival"`
	CPUSeconds        float64 `json:"cpu_seconds"`

	// RequestsRefused: requests whose KV is larger than MaxRequestBytes
	// (the clone budget: the most KV of one request the pipeline can hold
	// on the GPU); a server refuses them, so the run does not start them
	// and counts them here, with their KV in RefusedBytes. Tokens and
	// KVBytes are those of the requests served.
	RequestsRefused int   `json:"requests_refused"`
	RefusedBytes    int64 `json:"refused_kv_bytes"`
	MaxRequestBytes int64 `json:"max_request_kv_bytes"`
}

// BudgetPeak is a location's budget and the most it held in a run.
type BudgetPeak struct {
	Location  string `json:"location"`
	Budget    int64  `json:"budget_bytes"`
	PeakBytes int64  `json:"peak_bytes"`
}

// QueueSample: the live tasks by state at one moment of trace time.
type QueueSample struct {
	TraceSeconds float64 `json:"trace_seconds"`
	Pending      int     `json:"pending"`
	Queued       int     `json:"queued"`
	Copying      int     `json:"copying"`
	HostReady    int     `json:"host_ready"`
	CloneBytes   int64   `json:"clone_bytes"`
}
