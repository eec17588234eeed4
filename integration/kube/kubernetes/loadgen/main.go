// Command loadgen is the benchmarks' load generator. It sends requests through client-go's own HTTP transport, at
// the release the harness pins, so the load looks to a server as kubectl's does: one HTTP/2 connection per
// target, Go's flow-control windows, and Go's HPACK encoder, which indexes a bearer token after its first use.
//
// It reads one JSON command per line on stdin and answers each with one JSON line on stdout:
//
//	{"cmd":"target","id":"a","url":"https://...","ca":"PEM","cert":"PEM","key":"PEM","token":"...","headers":{"h":["v"]}}
//	    -> {}                                   (url may be plain http://, as kubectl proxy serves;
//	                                               an id defined again gets the new credentials)
//	{"cmd":"get","id":"a","path":"/api"}      -> {"status":200}
//	{"cmd":"run","id":"a","path":"/api","concurrency":32,"warmupSeconds":3,"seconds":5}
//	    -> {"warm":true}                        after the warm-up; the run starts on the next line ("go")
//	    -> {"ops":..,"seconds":..,"p50us":..,"p99us":..,"errors":..,"firstError":".."}
//	{"cmd":"alternate","ids":["a","b"],"path":"/api","warmupSeconds":3,"seconds":5}
//	    -> {"warm":true}                        as for run; then one request at a time, to each target in turn
//	    -> {"runs":[{"ops":..,"busySeconds":..,"p50us":..,...}, ...]}   one per id, in the order given
//
// A command that fails is answered with {"error":"..."}.
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"sort"
	"strings"
	"sync"
	"time"

	"k8s.io/client-go/rest"
)

type command struct {
	Cmd           string      `json:"cmd"`
	ID            string      `json:"id"`
	URL           string      `json:"url"`
	CA            string      `json:"ca"`
	Cert          string      `json:"cert"`
	Key           string      `json:"key"`
	Token         string      `json:"token"`
	Headers       http.Header `json:"headers"`
	Path          string      `json:"path"`
	Concurrency   int         `json:"concurrency"`
	IDs           []string    `json:"ids"`
	WarmupSeconds float64     `json:"warmupSeconds"`
	Seconds       float64     `json:"seconds"`
}

type target struct {
	base    string
	client  *http.Client
	headers http.Header
}

// newTarget builds the client kubectl would build from a kubeconfig with this server, CA and credentials. For a
// plain-HTTP server (kubectl proxy), a keep-alive pool with room for every concurrent request instead: client-go
// keeps only 25 idle connections per host, and HTTP/1.1 needs one per request in flight.
func newTarget(c command) (*target, error) {
	t := &target{base: strings.TrimSuffix(c.URL, "/"), headers: http.Header{}}
	for name, values := range c.Headers {
		t.headers[http.CanonicalHeaderKey(name)] = values
	}
	if strings.HasPrefix(c.URL, "http://") {
		t.client = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 256}}
		return t, nil
	}
	config := &rest.Config{
		Host:        c.URL,
		BearerToken: c.Token,
		TLSClientConfig: rest.TLSClientConfig{
			CAData:   []byte(c.CA),
			CertData: []byte(c.Cert),
			KeyData:  []byte(c.Key),
		},
	}
	client, err := rest.HTTPClientFor(config)
	if err != nil {
		return nil, err
	}
	t.client = client
	return t, nil
}

// get sends one GET and reads the whole answer, as a client decoding it would.
func (t *target) get(path string) (int, error) {
	req, err := http.NewRequest(http.MethodGet, t.base+path, nil)
	if err != nil {
		return 0, err
	}
	req.Header.Set("Accept", "application/json")
	for name, values := range t.headers {
		req.Header[name] = values
	}
	res, err := t.client.Do(req)
	if err != nil {
		return 0, err
	}
	_, err = io.Copy(io.Discard, res.Body)
	res.Body.Close()
	if err == nil && res.StatusCode != http.StatusOK {
		err = fmt.Errorf("GET %s: HTTP %d", path, res.StatusCode)
	}
	return res.StatusCode, err
}

type outcome struct {
	latencies  []time.Duration
	errors     int
	firstError string
}

// load keeps `concurrency` requests in flight for `seconds`, each loop sending its next request when the last
// one is answered.
func (t *target) load(path string, concurrency int, seconds float64) outcome {
	deadline := time.Now().Add(time.Duration(seconds * float64(time.Second)))
	results := make([]outcome, concurrency)
	var wg sync.WaitGroup
	for i := range results {
		wg.Add(1)
		go func(o *outcome) {
			defer wg.Done()
			for time.Now().Before(deadline) {
				started := time.Now()
				if _, err := t.get(path); err != nil {
					if o.errors == 0 {
						o.firstError = err.Error()
					}
					o.errors++
					continue
				}
				o.latencies = append(o.latencies, time.Since(started))
			}
		}(&results[i])
	}
	wg.Wait()
	var all outcome
	for _, o := range results {
		all.latencies = append(all.latencies, o.latencies...)
		if all.errors == 0 {
			all.firstError = o.firstError
		}
		all.errors += o.errors
	}
	return all
}

// alternate sends one request at a time for `seconds`, to each target in turn, each cycle in a new random order:
// every target's latency is sampled over the same stretch of time, so a drift of the machine or the API server
// (its garbage collector's pace, say) moves them all alike, and no target always follows the same one.
func alternate(targets []*target, path string, seconds float64) []outcome {
	deadline := time.Now().Add(time.Duration(seconds * float64(time.Second)))
	results := make([]outcome, len(targets))
	for time.Now().Before(deadline) {
		for _, i := range rand.Perm(len(targets)) {
			o := &results[i]
			started := time.Now()
			if _, err := targets[i].get(path); err != nil {
				if o.errors == 0 {
					o.firstError = err.Error()
				}
				o.errors++
				continue
			}
			o.latencies = append(o.latencies, time.Since(started))
		}
	}
	return results
}

// summary is what a run answers for one target. busySeconds adds up its requests' latencies: at one request at a
// time, ops/busySeconds is the rate the target alone would have served.
func summary(o outcome) map[string]any {
	sort.Slice(o.latencies, func(i, j int) bool { return o.latencies[i] < o.latencies[j] })
	var busy time.Duration
	for _, l := range o.latencies {
		busy += l
	}
	return map[string]any{
		"ops":         len(o.latencies),
		"busySeconds": busy.Seconds(),
		"p50us":       percentile(o.latencies, 50),
		"p99us":       percentile(o.latencies, 99),
		"errors":      o.errors,
		"firstError":  o.firstError,
	}
}

// percentile is the same estimate as bench/measure.ts: the value at floor(p% of n) in sorted order.
func percentile(sorted []time.Duration, p float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	i := min(len(sorted)-1, int(p/100*float64(len(sorted))))
	return float64(sorted[i].Nanoseconds()) / 1000
}

// lookUp returns the targets with these ids.
func lookUp(targets map[string]*target, ids []string) ([]*target, error) {
	found := make([]*target, len(ids))
	for i, id := range ids {
		if found[i] = targets[id]; found[i] == nil {
			return nil, fmt.Errorf("no target %q", id)
		}
	}
	return found, nil
}

func main() {
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 1<<20), 16<<20)
	out := json.NewEncoder(os.Stdout)
	answer := func(v any) {
		if err := out.Encode(v); err != nil {
			os.Exit(1)
		}
	}
	// warmed says a measurement's warm-up is over and waits for the line that starts it; false if stdin closed.
	warmed := func() bool {
		answer(map[string]bool{"warm": true})
		return in.Scan()
	}
	targets := map[string]*target{}
	for in.Scan() {
		var c command
		if err := json.Unmarshal(in.Bytes(), &c); err != nil {
			answer(map[string]string{"error": err.Error()})
			continue
		}
		t := targets[c.ID]
		if (c.Cmd == "get" || c.Cmd == "run") && t == nil {
			answer(map[string]string{"error": fmt.Sprintf("no target %q", c.ID)})
			continue
		}
		switch c.Cmd {
		case "target":
			t, err := newTarget(c)
			if err != nil {
				answer(map[string]string{"error": err.Error()})
				continue
			}
			// A target defined again (new credentials) drops the old one's connections.
			if old := targets[c.ID]; old != nil {
				old.client.CloseIdleConnections()
			}
			targets[c.ID] = t
			answer(map[string]string{})
		case "get":
			status, err := t.get(c.Path)
			if err != nil {
				answer(map[string]any{"status": status, "error": err.Error()})
				continue
			}
			answer(map[string]int{"status": status})
		case "run":
			t.load(c.Path, c.Concurrency, c.WarmupSeconds)
			if !warmed() {
				return
			}
			started := time.Now()
			o := t.load(c.Path, c.Concurrency, c.Seconds)
			run := summary(o)
			run["seconds"] = time.Since(started).Seconds()
			answer(run)
		case "alternate":
			alternating, err := lookUp(targets, c.IDs)
			if err != nil {
				answer(map[string]string{"error": err.Error()})
				continue
			}
			alternate(alternating, c.Path, c.WarmupSeconds)
			if !warmed() {
				return
			}
			runs := []map[string]any{}
			for _, o := range alternate(alternating, c.Path, c.Seconds) {
				runs = append(runs, summary(o))
			}
			answer(map[string]any{"runs": runs})
		default:
			answer(map[string]string{"error": fmt.Sprintf("unknown command %q", c.Cmd)})
		}
	}
}
