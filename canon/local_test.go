package canon

import (
	"fmt"
	"testing"
)

// TestLocalDigestEqualsWhereSumEquals guards WithLocalDigest's contract:
// within one Hasher, values get equal local digests exactly when their
// SHA-256 digests are equal, through Sum, SumValues and a Batch alike; the
// scheme byte is kept; a tombstone is Tombstone; and another Hasher's
// local digests of the same value differ (they are seeded per Hasher).
func TestLocalDigestEqualsWhereSumEquals(t *testing.T) {
	values := [][]byte{
		[]byte(`{"a":1,"b":[1,2,{"c":"x"}]}`),
		[]byte(` { "b" : [ 1 , 2 , { "c" : "x" } ] , "a" : 1 } `), // equal to the first
		[]byte(`{"a":1,"b":[1,2,{"c":"y"}]}`),
		[]byte(`{"a":1,"b":[2,1,{"c":"x"}]}`),
		[]byte(`{"a":1.0,"b":[1,2,{"c":"x"}]}`),
		[]byte(`{"a":1,"b":[1,2,{"c":"x"}],"at":"2030-01-01"}`), // equal to the first: /at is ignored
		[]byte(`null`),
		[]byte(`""`),
		nil, // a tombstone
	}
	opts := []Option{WithIgnore("/at")}
	sha, err := New(opts...)
	if err != nil {
		t.Fatal(err)
	}
	local, err := New(append(opts, WithLocalDigest())...)
	if err != nil {
		t.Fatal(err)
	}
	other, err := New(append(opts, WithLocalDigest())...)
	if err != nil {
		t.Fatal(err)
	}
	sum := func(h *Hasher, v []byte) Digest {
		t.Helper()
		d, err := h.Sum(v)
		if err != nil {
			t.Fatalf("Sum(%s): %v", v, err)
		}
		return d
	}
	b := local.NewBatch()
	var batched [16]Digest
	for i, v := range values {
		if _, err := b.Add(i, v, nil, nil); err != nil {
			t.Fatalf("Add(%s): %v", v, err)
		}
	}
	b.Flush(func(i int, d Digest) { batched[i] = d })
	for i, v := range values {
		d := sum(local, v)
		if d == sum(sha, v) && v != nil {
			t.Errorf("%s: the local digest is the SHA-256 digest", v)
		}
		if d.Scheme() != sum(sha, v).Scheme() {
			t.Errorf("%s: scheme %v, want %v", v, d.Scheme(), sum(sha, v).Scheme())
		}
		if v == nil && d != Tombstone {
			t.Errorf("a tombstone's local digest is %x, want Tombstone", d)
		}
		if v != nil && d == sum(other, v) {
			t.Errorf("%s: two Hashers compute the same local digest", v)
		}
		if sv, _, err := local.SumValues(v, nil, nil); err != nil || sv != d {
			t.Errorf("%s: SumValues gives %x (%v), Sum %x", v, sv, err, d)
		}
		if batched[i] != d {
			t.Errorf("%s: a Batch gives %x, Sum %x", v, batched[i], d)
		}
		for _, w := range values {
			if (sum(local, w) == d) != (sum(sha, w) == sum(sha, v)) {
				t.Errorf("%s and %s: local digests equal %v, SHA-256 digests equal %v",
					v, w, sum(local, w) == d, sum(sha, w) == sum(sha, v))
			}
		}
	}
}

// ExampleWithLocalDigest compares two values in memory without SHA-256.
func ExampleWithLocalDigest() {
	h, _ := New(WithIgnore("/seen_at"), WithLocalDigest())
	a, _ := h.Sum([]byte(`{"id":7,"name":"banana","seen_at":1}`))
	b, _ := h.Sum([]byte(`{"seen_at":2,"name":"banana","id":7}`))
	fmt.Println(a == b)
	// Output: true
}
