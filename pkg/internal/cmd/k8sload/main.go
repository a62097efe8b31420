// Command k8sload is the load of hack/k8s's rollout scenario: it sends
// signed Stripe events to a receiver running on Kubernetes while the
// script upgrades and restarts the Deployments, retries every delivery that
// was not answered 2xx (as Stripe does), then checks the ledger: every
// event answered 2xx has exactly one payments row and one processed_events
// row. It prints one line and exits 1 when anything was lost or doubled.
//
//	k8sload -url http://10.96.12.34:80 -secret whsec_x -database postgres://... \
//	  -events 3000 -dups 1 -duration 60s
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idempotent-events/idempotent-events/pkg/internal/harness"
)

func main() {
	url := flag.String("url", "", "receiver base URL (the Service)")
	secret := flag.String("secret", os.Getenv("WEBHOOK_SECRET"), "Stripe signing secret (default $WEBHOOK_SECRET)")
	database := flag.String("database", "", "PostgreSQL URL of the release's ledger")
	events := flag.Int("events", 2000, "distinct events")
	dups := flag.Int("dups", 1, "extra deliveries of each event (a sender's retries)")
	duration := flag.Duration("duration", time.Minute, "spread the first deliveries over this long")
	conc := flag.Int("concurrency", 16, "concurrent senders")
	settle := flag.Duration("settle", 3*time.Minute, "how long to wait for accepted events to reach the ledger")
	runID := flag.String("run", fmt.Sprintf("%d", time.Now().Unix()), "event id prefix of this run")
	flag.Parse()
	if *url == "" || *secret == "" || *database == "" {
		fmt.Fprintln(os.Stderr, "k8sload: -url, -secret and -database are required")
		os.Exit(2)
	}
	ctx := context.Background()
	s := harness.NewSender(*url, *secret, *conc)

	ids := make([]string, *events)
	for i := range ids {
		ids[i] = fmt.Sprintf("evt_k8s_%s_%06d", *runID, i)
	}
	var deliveries, refused, failedTransport atomic.Int64
	var lostSends []string
	var mu sync.Mutex
	// deliver posts body until it is answered 2xx or the settle time runs
	// out; every non-2xx answer is retried, like Stripe's retries.
	deliver := func(id string) bool {
		body := harness.Body(id)
		deadline := time.Now().Add(*settle)
		for time.Now().Before(deadline) {
			code, _ := s.Send(ctx, body)
			deliveries.Add(1)
			if code >= 200 && code < 300 {
				return true
			}
			if code == 0 {
				failedTransport.Add(1)
			} else {
				refused.Add(1)
			}
			time.Sleep(200 * time.Millisecond)
		}
		return false
	}
	work := make(chan string)
	var wg sync.WaitGroup
	for range *conc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for id := range work {
				for range 1 + *dups {
					if !deliver(id) {
						mu.Lock()
						lostSends = append(lostSends, id)
						mu.Unlock()
						break
					}
				}
			}
		}()
	}
	start := time.Now()
	every := *duration / time.Duration(max(*events, 1))
	for i, id := range ids {
		if wait := time.Until(start.Add(time.Duration(i) * every)); wait > 0 {
			time.Sleep(wait)
		}
		work <- id
	}
	close(work)
	wg.Wait()
	sendTime := time.Since(start)

	db, err := pgx.Connect(ctx, *database)
	if err != nil {
		fmt.Fprintln(os.Stderr, "k8sload:", err)
		os.Exit(1)
	}
	defer db.Close(ctx)
	prefix := fmt.Sprintf("evt_k8s_%s_%%", *runID)
	var l harness.Ledger
	deadline := time.Now().Add(*settle)
	for {
		if l, err = harness.ReadLedger(ctx, db, prefix); err != nil {
			fmt.Fprintln(os.Stderr, "k8sload:", err)
			os.Exit(1)
		}
		if (l.Payments >= len(ids) && l.Processed >= len(ids)) || time.Now().After(deadline) {
			break
		}
		time.Sleep(500 * time.Millisecond)
	}
	payments, processed, doubled := l.Payments, l.Processed, l.Doubled
	lost := len(ids) - payments
	fmt.Printf("k8sload: %d events, %d deliveries in %s (%d answered non-2xx, %d transport errors, all retried), ledger %d payments %d processed: lost %d, doubled %d, never accepted %d\n",
		len(ids), deliveries.Load(), sendTime.Round(time.Second), refused.Load(), failedTransport.Load(),
		payments, processed, lost, doubled, len(lostSends))
	if lost != 0 || doubled != 0 || processed != len(ids) || len(lostSends) != 0 {
		os.Exit(1)
	}
}
