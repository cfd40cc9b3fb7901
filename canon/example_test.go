package canon_test

import (
	"errors"
	"fmt"

	"github.com/dam-dedup/dam/canon"
)

func ExampleHasher_Sum() {
	h, err := canon.New()
	if err != nil {
		panic(err)
	}
	a, _ := h.Sum([]byte(`{"banana_id":"B-007","ripeness_level":"Perfectly Yellow"}`))
	b, _ := h.Sum([]byte(`{ "ripeness_level": "Perfectly Yellow", "banana_id": "B-\u0030\u00307" }`))
	c, _ := h.Sum([]byte(`{"banana_id":"B-007","ripeness_level":"Mostly Yellow"}`))
	fmt.Println(a == b, a == c)
	_, err = h.Sum([]byte(`{"a":1,"a":2}`))
	fmt.Println(err)
	// Output:
	// true false
	// canon: invalid JSON at byte 7: duplicate member: "a"
}

func ExampleNew_ignore() {
	h, err := canon.New(canon.WithIgnore("/updated_at", "/items/*/ts"))
	if err != nil {
		panic(err)
	}
	a, _ := h.Sum([]byte(`{"id":1,"updated_at":"2026-01-01","items":[{"sku":"a","ts":1}]}`))
	b, _ := h.Sum([]byte(`{"id":1,"updated_at":"2026-02-02","items":[{"sku":"a","ts":2}]}`))
	fmt.Println(a == b)
	_, err = canon.New(canon.WithIgnore("/a~2"))
	fmt.Println(err)
	// Output:
	// true
	// canon: ignore pointer "/a~2": invalid escape "~2" at byte 2
}

func ExampleHasher_AppendCanonical() {
	h, _ := canon.New(canon.WithIgnore("/ts"))
	out, _ := h.AppendCanonical(nil, []byte(`{"b":[1,"\u00e9"],"ts":5,"a":{"y":true,"x":null}}`))
	fmt.Print(string(out))
	// Output:
	// {
	//   "a": {
	//     "x": null,
	//     "y": true
	//   },
	//   "b": [
	//     1,
	//     "é"
	//   ]
	// }
}

func ExampleHasher_SumValues() {
	// A route whose entity is a member of the value (entity: /banana_id),
	// which also reads a version, in the pass that computes the digest.
	h, err := canon.New(canon.WithIgnore("/updated_at"), canon.WithValues("/banana_id", "/version"))
	if err != nil {
		panic(err)
	}
	var vals [2]canon.Value
	var arena []byte // reused for every record: no allocation once grown
	d, arena, err := h.SumValues([]byte(`{"banana_id":"B-\u0030\u00307","version":42,"updated_at":"2026-11-21"}`), arena[:0], vals[:])
	fmt.Printf("%q %v, %s %v, %v\n", vals[0].Bytes, vals[0].Kind, vals[1].Bytes, vals[1].Kind, err)
	plain, _ := canon.New(canon.WithIgnore("/updated_at"))
	same, _ := plain.Sum([]byte(`{"version":42,"banana_id":"B-007"}`))
	fmt.Println(d == same)
	_, _, err = h.SumValues([]byte(`{"version":43}`), arena[:0], vals[:])
	fmt.Println(err, errors.Is(err, canon.ErrNoValue))
	// Output:
	// "B-007" string, 42 number, <nil>
	// true
	// canon: no value at "/banana_id" true
}

func ExampleBatch() {
	h, err := canon.New(canon.WithValues("/id"))
	if err != nil {
		panic(err)
	}
	records := [][]byte{
		[]byte(`{"id":"B-1","ripeness":"Green"}`),
		[]byte(`{"ripeness":"Green","id":"B-1"}`),
		[]byte(`{"ripeness":"Green"}`),
		[]byte(`{"id":"B-2","ripeness":"Yellow"}`),
	}
	b := h.NewBatch()
	digests := make([]canon.Digest, len(records))
	for i, r := range records {
		var id [1]canon.Value
		if _, err := b.Add(i, r, nil, id[:]); err != nil {
			fmt.Println(i, err) // nothing queued for i
			continue
		}
		fmt.Println(i, string(id[0].Bytes))
	}
	b.Flush(func(i int, d canon.Digest) { digests[i] = d })
	fmt.Println(digests[0] == digests[1], digests[0] == digests[3], digests[2].IsZero())
	// Output:
	// 0 B-1
	// 1 B-1
	// 2 canon: no value at "/id"
	// 3 B-2
	// true false true
}
