package staging

// FailureReporter is optional on a [Runtime]: a runtime that has it (as
// *system.System has) receives a pipeline's failure, once, when the
// pipeline records it, and writes it as a structured event at the level
// and rate its application chose.
type FailureReporter interface {
	ReportStagingFailure(pipeline, device string, task uint64, err error)
}

// reportFailure hands the pipeline's failure to the runtime, if it takes
// one.
func (p *Pipeline) reportFailure(t TaskID, err error) {
	if r, ok := p.rt.(FailureReporter); ok {
		r.ReportStagingFailure(p.cfg.Name, p.cfg.Device, uint64(t), err)
	}
}
