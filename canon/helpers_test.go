package canon

import (
	"bytes"
	"fmt"
	"testing"
)

// mustNew returns a Hasher of opts, failing the test on an error.
func mustNew(t testing.TB, opts ...Option) *Hasher {
	t.Helper()
	h, err := New(opts...)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// mustSum returns h's digest of in, failing the test on an error.
func mustSum(t testing.TB, h *Hasher, in string) Digest {
	t.Helper()
	d, err := h.Sum([]byte(in))
	if err != nil {
		t.Fatalf("Sum(%q): %v", in, err)
	}
	return d
}

// projection returns a deterministic, realistic projection document of
// about size bytes: nested objects, an array of objects, strings with
// escapes and non-ASCII text, numbers, booleans, nulls and timestamps.
func projection(size int) []byte {
	if size < 400 {
		// The small projection a narrow adapter gets: about 200 bytes.
		return []byte(`{"banana_id":"B-007","name":"Mr. Banana","ripeness_level":"Mostly Yellow",` +
			`"updated_at":"2026-11-21T19:43:21Z","version":42,"active":true,"ref":null,` +
			`"origin":{"country":"EC","lat":-1.8312},"tags":["caf\u00e9","Grün"]}`)
	}
	var b bytes.Buffer
	b.WriteString(`{"banana_id":"B-007","name":"Mr. Banana","ripeness_level":"Mostly Yellow",` +
		`"updated_at":"2026-11-21T19:43:21.123456Z","version":42,"active":true,"discontinued":null,` +
		`"origin":{"country":"EC","farm":"Finca \"La Esperanza\"","coords":{"lat":-1.8312,"lon":-78.1834}},` +
		`"tags":["organic","fair-trade","caf\u00e9","Gr\u00fcn"],"items":[`)
	for i := 0; b.Len() < size-40; i++ {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `{"sku":"SKU-%05d","qty":%d,"price":%d.%02d,"ts":"2026-11-%02dT10:%02d:00Z",`+
			`"note":"Größe %d \u2013 süß","gift":%t,"ref":null}`,
			i*7919%100000, i%13+1, 1+i%97, i%100, 1+i%28, i%60, i, i%3 == 0)
	}
	b.WriteString(`],"summary":{"count":3,"currency":"EUR"}}`)
	return b.Bytes()
}

// seqSep separates the documents of a FuzzSequence input: the record
// separator of JSON text sequences (RFC 7464), never valid inside JSON.
const seqSep = "\x1e"
