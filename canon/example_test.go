package canon_test

import (
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
