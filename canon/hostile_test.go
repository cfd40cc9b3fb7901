package canon

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"strings"
	"testing"
	"unicode/utf8"
)

// allocated returns the bytes f allocates (roughly: other goroutines count too).
func allocated(f func()) uint64 {
	var a, b runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&a)
	f()
	runtime.ReadMemStats(&b)
	return b.TotalAlloc - a.TotalAlloc
}

func TestHostileDeepArray(t *testing.T) {
	in := bytes.Repeat([]byte("["), 10<<20)
	h := mustNew(t, WithMaxSize(16<<20))
	var err error
	n := allocated(func() { _, err = h.Sum(in) })
	var e *Error
	if !errors.As(err, &e) || e.Err != ErrTooDeep || e.Offset != DefaultMaxDepth {
		t.Fatalf("10 MB of '[': %v", err)
	}
	if n > 1<<20 {
		t.Errorf("10 MB of '[' allocated %d bytes", n)
	}
	if _, err := mustNew(t).Sum(in); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("10 MB of '[' at the default size: %v", err)
	}
	// Deep nesting within the limits never recurses: a raised depth works.
	deep := mustNew(t, WithMaxDepth(1<<20), WithMaxSize(16<<20))
	in = append(bytes.Repeat([]byte(`{"a":[`), 200000), bytes.Repeat([]byte("]}"), 200000)...)
	if _, err := deep.Sum(in); err != nil {
		t.Fatalf("depth 400000: %v", err)
	}
}

func TestHostileLongNumber(t *testing.T) {
	in := append([]byte("1"), bytes.Repeat([]byte("0"), DefaultMaxSize-1)...)
	h := mustNew(t)
	var err error
	n := allocated(func() { _, err = h.Sum(in) })
	if err != nil {
		t.Fatalf("1 MiB number: %v", err)
	}
	if n > 4<<20 {
		t.Errorf("1 MiB number allocated %d bytes", n)
	}
	if _, err := h.Sum(append(in, '0')); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("1 MiB + 1 number: %v", err)
	}
}

func TestHostileManyMembers(t *testing.T) {
	const n = 100000
	keys := rand.New(rand.NewPCG(7, 8)).Perm(n)
	var a, b bytes.Buffer
	a.WriteByte('{')
	b.WriteByte('{')
	for i := range n {
		if i > 0 {
			a.WriteByte(',')
			b.WriteByte(',')
		}
		fmt.Fprintf(&a, `"k%d":%d`, keys[i], keys[i])
		fmt.Fprintf(&b, `"k%d":%d`, i, i)
	}
	a.WriteByte('}')
	b.WriteByte('}')
	h := mustNew(t, WithMaxSize(4<<20))
	var da Digest
	var err error
	m := allocated(func() { da, err = h.Sum(a.Bytes()) })
	if err != nil {
		t.Fatalf("100000 members: %v", err)
	}
	if m > 32<<20 {
		t.Errorf("100000 members (%d bytes) allocated %d bytes", a.Len(), m)
	}
	if db := mustSum(t, h, b.String()); da != db {
		t.Error("100000 members: order changed the hash")
	}
	// A duplicate among them is found.
	dup := append(bytes.TrimSuffix(a.Bytes(), []byte("}")), `,"k777":1}`...)
	if _, err := h.Sum(dup); !errors.Is(err, ErrDuplicateMember) {
		t.Fatalf("100001 members with a duplicate: %v", err)
	}
}

func TestHostileNeverPanics(t *testing.T) {
	// Every prefix of a rich document is an error or a value, never a panic.
	doc := []byte(`{"a":[1,-2.5e+3,"x\u00e9\ud83c\udf4c\n",{"b":null,"c":true}],"d":false,"é":{}}`)
	h := mustNew(t, WithIgnore("/a/*/b", "/d"))
	for i := range doc {
		if _, err := h.Sum(doc[:i]); err == nil && i != 0 {
			t.Errorf("prefix %q accepted", doc[:i])
		}
	}
	if _, err := h.Sum(doc); err != nil {
		t.Fatal(err)
	}
}

// An error quotes at most 64 bytes of the input: a duplicate 490 kB
// member name gives an error of at most 200 bytes, valid UTF-8, naming the
// length, so that its log line and dead letter stay small enough for Kafka.
func TestErrorQuotesLittleInput(t *testing.T) {
	long := strings.Repeat("n", 490_000)
	for _, in := range []string{
		`{"` + long + `":1,"` + long + `":2}`,
		`{"` + strings.Repeat("é", 100) + `":1,"` + strings.Repeat("é", 100) + `":2}`,
	} {
		_, err := mustNew(t, WithMaxSize(2<<20)).Sum([]byte(in))
		if !errors.Is(err, ErrDuplicateMember) {
			t.Fatalf("want a duplicate member, got %v", err)
		}
		if n := len(err.Error()); n > 200 {
			t.Errorf("error of %d bytes: %.120s…", n, err.Error())
		}
		if !utf8.ValidString(err.Error()) || !strings.Contains(err.Error(), "bytes)") {
			t.Errorf("error %q: want valid UTF-8 naming the length", err)
		}
	}
	if _, err := mustNew(t).Sum([]byte(`{"ab":1,"ab":2}`)); err == nil || !strings.HasSuffix(err.Error(), `duplicate member: "ab"`) {
		t.Errorf("a short name is quoted whole: %v", err)
	}
}
