package dedup_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/dam-dedup/dam/dedup"
)

func TestCheckIdentity(t *testing.T) {
	for _, c := range []struct {
		name    string
		service string
		entity  []byte
		ok      bool
	}{
		{"plain", "customer-2", []byte("B-007"), true},
		{"binary entity", "s", []byte{0, 0xff, 0x1b}, true},
		{"empty entity", "s", []byte{}, true},
		{"entity at the limit", "s", make([]byte, dedup.MaxEntityBytes), true},
		{"entity past the limit", "s", make([]byte, dedup.MaxEntityBytes+1), false},
		{"service at the limit", strings.Repeat("s", dedup.MaxServiceBytes), nil, true},
		{"service past the limit", strings.Repeat("s", dedup.MaxServiceBytes+1), nil, false},
		{"empty service", "", nil, false},
		{"NUL in service", "a\x00b", nil, false},
		{"escape in service", "evil\x1b]0;pwned\a", nil, false},
		{"invalid UTF-8 service", "a\xffb", nil, false},
		{"non-ASCII service", "kunde-ü", nil, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			err := dedup.CheckService(c.service)
			if err == nil {
				err = dedup.CheckEntity(c.entity)
			}
			if (err == nil) != c.ok {
				t.Fatalf("ok %v, got %v", c.ok, err)
			}
			if err != nil && !errors.Is(err, dedup.ErrIdentity) {
				t.Fatalf("%v does not wrap ErrIdentity", err)
			}
		})
	}
}

// The longest identity is stored in every mode's table: the limits hold
// against the server's index row limit, not only as constants.
func TestLongestIdentityIsStored(t *testing.T) {
	s := newStore(t)
	ctx := t.Context()
	service := strings.Repeat("s", dedup.MaxServiceBytes)
	entity := []byte(strings.Repeat("\xfe", dedup.MaxEntityBytes))
	for _, rule := range []dedup.Rule{{}, {Mode: dedup.Window, Window: time.Hour}, {Mode: dedup.Version}} {
		p, epoch := partition(t, s, "t-"+rule.Mode.String())
		b := &dedup.Batch{Service: service, Rule: rule, Partition: p, Epoch: epoch, Start: 0, End: 1,
			Records: []dedup.Record{{Offset: 0, Entity: entity, Digest: digest("a"), Version: 1}}}
		if d, err := s.Decide(ctx, b, nil); err != nil || d[0] != dedup.Forward {
			t.Fatalf("%v: %v %v", rule.Mode, d, err)
		}
		if _, err := s.CheckBatch(ctx, []dedup.CheckItem{{Service: service, Entity: entity, Digest: digest("b")}}, nil); err != nil && rule.Mode == dedup.LastSeen {
			t.Fatalf("check: %v", err)
		}
	}
	p, epoch := partition(t, s, "long")
	long := &dedup.Batch{Service: "s", Partition: p, Epoch: epoch, End: 1,
		Records: []dedup.Record{{Offset: 0, Entity: make([]byte, dedup.MaxEntityBytes+1), Digest: digest("a")}}}
	if _, err := s.Decide(ctx, long, nil); !errors.Is(err, dedup.ErrInvalid) || !errors.Is(err, dedup.ErrIdentity) {
		t.Fatalf("an entity past the limit: %v", err)
	}
	if _, err := s.CheckBatch(ctx, []dedup.CheckItem{{Service: "s\x00", Entity: nil, Digest: digest("a")}}, nil); !errors.Is(err, dedup.ErrIdentity) {
		t.Fatalf("a NUL in a service: %v", err)
	}
}
