// Command fakedam stands in for dam in releasecheck's tests: it prints
// `dam version`'s line with what the build stamped.
package main

import (
	"fmt"
	"runtime"
)

var version, commit, date = "dev", "unknown", "unknown"

func main() {
	fmt.Printf("dam %s (commit %s, %s) %s %s/%s\n", version, commit, date, runtime.Version(), runtime.GOOS, runtime.GOARCH)
}
