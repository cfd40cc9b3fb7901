package pipeline

// Step names a point of the delivery protocol, for fault injection: the
// chaos tests pause a process there (SIGSTOP) to make it a zombie at that
// exact point.
type Step string

// The steps a StepHook is called at, in the order a batch goes through them.
const (
	// StepDecided: a batch's decide transaction committed; its records are
	// not yet handed to the producer.
	StepDecided Step = "decided"
	// StepProducing: a batch's records are handed to the producer; their
	// acknowledgements are awaited.
	StepProducing Step = "producing"
	// StepAcked: every record of a batch is acknowledged; its offset is not
	// yet committed.
	StepAcked Step = "acked"
)

// StepHook is called, synchronously, each time a partition's batch reaches
// a step. It is for tests that inject faults; production code sets none.
type StepHook func(step Step, topic string, partition int32)

// WithStepHook sets a hook called at every protocol step (fault injection
// in tests; see Step).
func WithStepHook(h StepHook) Option { return func(p *Pipeline) { p.hook = h } }

// step calls the hook, if any.
func (w *worker) step(s Step) {
	if w.d.hook != nil {
		w.d.hook(s, w.part.Topic, w.part.Partition)
	}
}
