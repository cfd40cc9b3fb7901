package main

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// hogResult is what a well-behaved tenant saw beside the hogs.
type hogResult struct {
	BodyHogs, IdleConns int
	BodyRequests        int            // body hog requests sent
	BodyAnswers         map[string]int // their answers: "408", "error ..."
	IdleOpened          int            // idle connections opened
	Checks              int
	NotOK               int      // checks not answered 200
	Bad                 []string // the first of them
	P50, P99, Max       time.Duration
}

// runHogs runs o.BodyHogs body hogs (requests of hogToken that announce
// the largest body and send nothing, each sent again once answered) and
// o.IdleConns idle connections (that send nothing, each opened again once
// closed) against the dam serve at base, and meanwhile checks, eight at a
// time for o.HogFor, as a well-behaved tenant (token). Loopback only;
// every loop ends when the run does.
func runHogs(base string, o hostileOptions) hogResult {
	res := hogResult{BodyHogs: o.BodyHogs, IdleConns: o.IdleConns, BodyAnswers: map[string]int{}}
	u, err := url.Parse(base)
	if err != nil {
		res.Bad = append(res.Bad, err.Error())
		return res
	}
	addr := u.Host
	stop := make(chan struct{})
	var hogs sync.WaitGroup
	var mu sync.Mutex
	var opened, bodies atomic.Int64
	// pause keeps a hog's loop from spinning when the server refuses it
	// at once.
	pause := func() bool {
		select {
		case <-stop:
			return false
		case <-time.After(50 * time.Millisecond):
			return true
		}
	}
	for i := range o.IdleConns {
		hogs.Add(1)
		go func() {
			defer hogs.Done()
			time.Sleep(time.Duration(i%100) * time.Millisecond) // spread the first dials
			for {
				c, err := net.DialTimeout("tcp", addr, 2*time.Second)
				if err == nil {
					opened.Add(1)
					done := make(chan struct{})
					go func() {
						select {
						case <-stop:
							c.Close()
						case <-done:
						}
					}()
					_, _ = io.Copy(io.Discard, c) // until the server closes it
					close(done)
					c.Close()
				}
				if !pause() {
					return
				}
			}
		}()
	}
	head := fmt.Sprintf("POST /v1/check HTTP/1.1\r\nHost: dam\r\nAuthorization: Bearer %s\r\nContent-Length: %d\r\n\r\n", hogToken, 16<<20)
	for range o.BodyHogs {
		hogs.Add(1)
		go func() {
			defer hogs.Done()
			for {
				c, err := net.DialTimeout("tcp", addr, 2*time.Second)
				if err == nil {
					bodies.Add(1)
					done := make(chan struct{})
					go func() {
						select {
						case <-stop:
							c.Close()
						case <-done:
						}
					}()
					a := "no answer"
					if _, err := io.WriteString(c, head); err == nil {
						if resp, err := http.ReadResponse(bufio.NewReader(c), nil); err == nil {
							a = strconv.Itoa(resp.StatusCode)
							resp.Body.Close()
						} else {
							a = "error"
						}
					}
					close(done)
					c.Close()
					select {
					case <-stop:
						return
					default:
					}
					mu.Lock()
					res.BodyAnswers[a]++
					mu.Unlock()
				}
				if !pause() {
					return
				}
			}
		}()
	}
	time.Sleep(1500 * time.Millisecond) // the hogs are in place, and cycling

	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 8}}
	var lat []time.Duration
	var n atomic.Int64
	end := time.Now().Add(o.HogFor)
	var good sync.WaitGroup
	for w := range 8 {
		good.Add(1)
		go func() {
			defer good.Done()
			for time.Now().Before(end) {
				i := n.Add(1)
				body := fmt.Sprintf(`{"service":%q,"entity":"beside-hogs-%d-%d","payload":{"n":%d}}`, service, w, i, i)
				began := time.Now()
				a := hostilePost(client, base, "/v1/check", []byte(body), false, false)
				took := time.Since(began)
				mu.Lock()
				if a == "200" {
					lat = append(lat, took)
				} else {
					res.Bad = append(res.Bad, fmt.Sprintf("%s after %s", a, took.Round(time.Millisecond)))
				}
				mu.Unlock()
			}
		}()
	}
	good.Wait()
	close(stop)
	hogs.Wait()
	res.IdleOpened, res.BodyRequests = int(opened.Load()), int(bodies.Load())
	slices.Sort(lat)
	res.Checks, res.NotOK = len(lat)+len(res.Bad), len(res.Bad)
	if len(lat) > 0 {
		res.P50, res.P99, res.Max = lat[len(lat)/2], lat[min(len(lat)-1, len(lat)*99/100)], lat[len(lat)-1]
	}
	if len(res.Bad) > 5 {
		res.Bad = append(res.Bad[:5], fmt.Sprintf("and %d more", len(res.Bad)-5))
	}
	return res
}
