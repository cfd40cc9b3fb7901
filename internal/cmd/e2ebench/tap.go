package main

import (
	"bufio"
	"bytes"
	"context"
	"net/http"
	"strconv"
	"time"
)

// tapToken is dam-tap's http.tap.token.
const tapToken = "e2ebench-tap-0123456789abcdef"

// tapStats is what dam-tap's reader saw: the decisions it read, and those
// the sidecar reported lost (it did not keep up).
type tapStats struct {
	lines, lost int64
}

// readTap attaches to the sidecar's GET /v1/tap as soon as it answers
// and reads every line, as `dam tap -o json` does, until the sidecar ends
// the stream or ctx ends.
func readTap(ctx context.Context, httpAddr string) tapStats {
	var st tapStats
	for ctx.Err() == nil {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+httpAddr+"/v1/tap", nil)
		if err != nil {
			logf("dam-tap: %v", err)
			return st
		}
		req.Header.Set("Authorization", "Bearer "+tapToken)
		resp, err := http.DefaultClient.Do(req)
		if err != nil || resp.StatusCode != http.StatusOK {
			if err == nil {
				resp.Body.Close()
			}
			time.Sleep(10 * time.Millisecond) // not listening yet
			continue
		}
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		lost := []byte(`{"lost":`)
		for sc.Scan() {
			if l := sc.Bytes(); bytes.HasPrefix(l, lost) {
				n, _ := strconv.ParseInt(string(bytes.TrimSuffix(l[len(lost):], []byte("}"))), 10, 64)
				st.lost += n
			} else {
				st.lines++
			}
		}
		resp.Body.Close()
		return st
	}
	return st
}
