// Package retry runs an operation until it succeeds, with capped exponential
// backoff: the one retry loop of dam (on cenkalti/backoff's Retry), used by
// the pipeline's steps and by the start-time migration.
//
// An operation ends the loop early by returning an error wrapped with
// Permanent (a fence, a bug, a migration that cannot apply); every other
// error is retried until the context ends.
package retry

import (
	"context"
	"time"

	"github.com/cenkalti/backoff/v5"
)

// Policy is the backoff between attempts: the first wait is Min, each next
// one longer (with jitter), never above Max.
type Policy struct {
	Min, Max time.Duration
}

// Notify is told about each failed attempt and the wait before the next.
type Notify func(err error, wait time.Duration)

// Backoff returns the policy's sequence of waits, for a loop that cannot be
// written as one operation (a retry that waits for new input meanwhile).
func (p Policy) Backoff() *backoff.ExponentialBackOff {
	bo := backoff.NewExponentialBackOff()
	bo.InitialInterval = p.Min
	bo.MaxInterval = p.Max
	return bo
}

// Do runs op until it returns a nil error, a Permanent error (returned
// unwrapped), or ctx ends (its cause is returned). There is no limit on the
// number of attempts or on the time spent: failure means pause, not guess.
func Do[T any](ctx context.Context, p Policy, notify Notify, op func() (T, error)) (T, error) {
	opts := []backoff.RetryOption{backoff.WithBackOff(p.Backoff()), backoff.WithMaxElapsedTime(0)}
	if notify != nil {
		opts = append(opts, backoff.WithNotify(backoff.Notify(notify)))
	}
	return backoff.Retry(ctx, op, opts...)
}

// Run is Do for an operation without a result.
func Run(ctx context.Context, p Policy, notify Notify, op func() error) error {
	_, err := Do(ctx, p, notify, func() (struct{}, error) { return struct{}{}, op() })
	return err
}

// Permanent marks err as not worth retrying: Do returns it at once.
func Permanent(err error) error { return backoff.Permanent(err) }
