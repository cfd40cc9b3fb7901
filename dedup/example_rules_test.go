package dedup_test

import (
	"fmt"
	"log"
	"time"

	"github.com/dam-dedup/dam/canon"
	"github.com/dam-dedup/dam/dedup"
)

// A rule is a pure function: the stored state of an identity, a record
// and the clock in; the decision, its cause and the new state out. Here
// last-seen with refresh_after, over one identity's records.
func ExampleRule_Decide() {
	h, err := canon.New(canon.WithIgnore("/updated_at"))
	if err != nil {
		log.Fatal(err)
	}
	sum := func(v string) canon.Digest {
		d, err := h.Sum([]byte(v))
		if err != nil {
			log.Fatal(err)
		}
		return d
	}
	rule := dedup.Rule{RefreshAfter: time.Hour}
	t0 := time.Date(2030, 1, 2, 3, 0, 0, 0, time.UTC)
	var st dedup.Stored // no state yet
	for _, r := range []struct {
		value string
		at    time.Duration
	}{
		{`{"ripe":"green","updated_at":1}`, 0},
		{`{"updated_at":2,"ripe":"green"}`, time.Minute},      // only an ignored field changed
		{`{"ripe":"yellow","updated_at":3}`, 2 * time.Minute}, // changed
		{`{"ripe":"yellow","updated_at":4}`, time.Hour},       // 58 minutes after the last forward
		{`{"ripe":"yellow","updated_at":5}`, 3 * time.Hour},   // more than an hour after it
	} {
		o := rule.Decide(st, sum(r.value), 0, t0.Add(r.at))
		fmt.Printf("+%v: %s (%s)\n", r.at, o.Decision, o.Cause)
		st = o.State
	}
	fmt.Println("last forwarded at", st.Forwarded.Format(time.Kitchen))
	// Output:
	// +0s: forward (no-state)
	// +1m0s: duplicate (unchanged)
	// +2m0s: forward (changed)
	// +1h0m0s: duplicate (unchanged)
	// +3h0m0s: refresh (refresh-due)
	// last forwarded at 6:00AM
}

// Window mode remembers message ids: a repeat inside the window is a
// duplicate whatever its content; sliding, each repeat restarts the window.
func ExampleRule_Decide_window() {
	rule := dedup.Rule{Mode: dedup.Window, Window: time.Hour, Sliding: true}
	t0 := time.Date(2030, 1, 2, 3, 0, 0, 0, time.UTC)
	d := canon.Digest{byte(canon.SchemeBytes1), 1} // the content does not count
	var st dedup.Stored
	for _, at := range []time.Duration{0, 50 * time.Minute, 100 * time.Minute, 160 * time.Minute} {
		o := rule.Decide(st, d, 0, t0.Add(at))
		fmt.Printf("+%v: %s (%s), window until %s\n", at, o.Decision, o.Cause, o.State.Expires.Format(time.Kitchen))
		st = o.State
	}
	// Output:
	// +0s: forward (no-state), window until 4:00AM
	// +50m0s: duplicate (in-window), window until 4:50AM
	// +1h40m0s: duplicate (in-window), window until 5:40AM
	// +2h40m0s: forward (expired), window until 6:40AM
}

// Version mode forwards rising versions: a repeated version is a
// duplicate, a lower one stale.
func ExampleRule_Decide_version() {
	rule := dedup.Rule{Mode: dedup.Version}
	now := time.Date(2030, 1, 2, 3, 0, 0, 0, time.UTC)
	d := canon.Digest{byte(canon.SchemeJSON1), 1}
	var st dedup.Stored
	for _, v := range []int64{3, 3, 2, 5} {
		o := rule.Decide(st, d, v, now)
		fmt.Printf("version %d: %s (%s), stored %d\n", v, o.Decision, o.Cause, o.State.Version)
		st = o.State
	}
	// Output:
	// version 3: forward (no-state), stored 3
	// version 3: duplicate (same-version), stored 3
	// version 2: stale (older), stored 3
	// version 5: forward (newer), stored 5
}
