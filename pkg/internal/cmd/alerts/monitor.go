package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/idempotent-events/idempotent-events/pkg/internal/harness"
)

// tool is a Prometheus or Alertmanager process, its output in a file.
type tool struct {
	name string
	cmd  *exec.Cmd
	log  string
	done chan struct{}
}

func startTool(dir, name, bin string, args ...string) (*tool, error) {
	logPath := filepath.Join(dir, name+".log")
	f, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	t := &tool{name: name, cmd: exec.Command(bin, args...), log: logPath, done: make(chan struct{})}
	t.cmd.Stdout, t.cmd.Stderr = f, f
	if err := t.cmd.Start(); err != nil {
		f.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	go func() { _ = t.cmd.Wait(); f.Close(); close(t.done) }()
	return t, nil
}

// stop ends the process (SIGTERM, then SIGKILL after 5 s) and waits.
func (t *tool) stop() {
	_ = t.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-t.done:
	case <-time.After(5 * time.Second):
		_ = t.cmd.Process.Kill()
		<-t.done
	}
}

// tail is the last n lines of the process's output.
func (t *tool) tail(n int) string {
	b, _ := os.ReadFile(t.log)
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// monitor is the suite's monitoring: a real Prometheus that scrapes the
// processes listed in a file_sd file and evaluates the rule file, a real
// Alertmanager it sends its alerts to, and the webhook Alertmanager
// notifies.
type monitor struct {
	dir              string
	prom, am         *tool
	promURL, amURL   string
	hook             *webhook
	targetsFile      string
	namespace        string
	mu               sync.Mutex
	targets          map[string]string // address -> job
	client           *http.Client
	scrape, evaluate time.Duration
}

// startMonitor writes the configurations and starts Alertmanager and
// Prometheus; rules is the rule file Prometheus loads.
func startMonitor(ctx context.Context, dir, toolsDir, rules, namespace string, every time.Duration) (*monitor, error) {
	m := &monitor{dir: dir, namespace: namespace, targets: map[string]string{}, targetsFile: filepath.Join(dir, "targets.json"),
		client: &http.Client{Timeout: 10 * time.Second}, scrape: every, evaluate: every}
	var err error
	if m.hook, err = startWebhook(); err != nil {
		return nil, err
	}
	amAddr, promAddr := harness.FreeAddr(), harness.FreeAddr()
	m.amURL, m.promURL = "http://"+amAddr, "http://"+promAddr
	// Every alert is a group of its own, notified at once and again at
	// most every second when it changes, resolved ones included.
	amConfig := fmt.Sprintf(`route:
  receiver: webhook
  group_by: ['...']
  group_wait: 0s
  group_interval: 1s
  repeat_interval: 24h
receivers:
  - name: webhook
    webhook_configs:
      - url: %s
        send_resolved: true
`, m.hook.url)
	promConfig := fmt.Sprintf(`global:
  scrape_interval: %[1]s
  scrape_timeout: %[1]s
  evaluation_interval: %[1]s
rule_files: [rules.yaml]
alerting:
  alertmanagers:
    - static_configs:
        - targets: ['%[2]s']
scrape_configs:
  - job_name: idempotent-events
    file_sd_configs:
      - files: ['%[3]s']
        refresh_interval: 1s
`, promDuration(every), amAddr, m.targetsFile)
	for name, content := range map[string]string{"alertmanager.yaml": amConfig, "prometheus.yaml": promConfig, "rules.yaml": rules} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			return nil, err
		}
	}
	if err := m.writeTargets(); err != nil {
		return nil, err
	}
	if m.am, err = startTool(dir, "alertmanager", filepath.Join(toolsDir, "alertmanager"),
		"--config.file="+filepath.Join(dir, "alertmanager.yaml"), "--storage.path="+filepath.Join(dir, "am-data"),
		"--web.listen-address="+amAddr, "--cluster.listen-address=", "--log.level=warn"); err != nil {
		return nil, err
	}
	// resend-delay: a firing alert is sent to Alertmanager again at most
	// this often (Prometheus sends state changes at once either way).
	if m.prom, err = startTool(dir, "prometheus", filepath.Join(toolsDir, "prometheus"),
		"--config.file="+filepath.Join(dir, "prometheus.yaml"), "--storage.tsdb.path="+filepath.Join(dir, "prom-data"),
		"--web.listen-address="+promAddr, "--rules.alert.resend-delay=1s", "--log.level=warn"); err != nil {
		m.close()
		return nil, err
	}
	for _, c := range []struct {
		t   *tool
		url string
	}{{m.am, m.amURL + "/-/ready"}, {m.prom, m.promURL + "/-/ready"}} {
		if err := waitReady(ctx, c.t, c.url); err != nil {
			m.close()
			return nil, err
		}
	}
	return m, nil
}

func waitReady(ctx context.Context, t *tool, url string) error {
	deadline := time.Now().Add(60 * time.Second)
	for {
		select {
		case <-t.done:
			return fmt.Errorf("%s exited at start:\n%s", t.name, t.tail(20))
		default:
		}
		resp, err := http.Get(url)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("%s not ready at %s after 60s:\n%s", t.name, url, t.tail(20))
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func (m *monitor) close() {
	for _, t := range []*tool{m.prom, m.am} {
		if t != nil {
			t.stop()
		}
	}
	if m.hook != nil {
		m.hook.close()
	}
}

// addTarget makes Prometheus scrape addr's /metrics as job, with the
// namespace label the chart's ServiceMonitor gives its targets.
func (m *monitor) addTarget(addr, job string) error {
	m.mu.Lock()
	m.targets[addr] = job
	m.mu.Unlock()
	return m.writeTargets()
}

func (m *monitor) writeTargets() error {
	m.mu.Lock()
	type group struct {
		Targets []string          `json:"targets"`
		Labels  map[string]string `json:"labels"`
	}
	groups := []group{}
	for addr, job := range m.targets {
		groups = append(groups, group{Targets: []string{addr}, Labels: map[string]string{"job": job, "namespace": m.namespace}})
	}
	m.mu.Unlock()
	sort.Slice(groups, func(i, j int) bool { return groups[i].Targets[0] < groups[j].Targets[0] })
	b, err := json.Marshal(groups)
	if err != nil {
		return err
	}
	// Written whole and renamed, so Prometheus never reads half a file.
	tmp := m.targetsFile + ".tmp"
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, m.targetsFile)
}

// waitScraped waits until Prometheus has scraped addr successfully.
func (m *monitor) waitScraped(ctx context.Context, addr string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		res, err := m.query(ctx, fmt.Sprintf(`up{instance=%q}`, addr), time.Time{})
		if err == nil && len(res) == 1 && res[0].Value == 1 {
			return nil
		}
		if time.Now().After(deadline) {
			if err != nil {
				return fmt.Errorf("prometheus has not scraped %s within %s: %w", addr, timeout, err)
			}
			return fmt.Errorf("prometheus has not scraped %s within %s (up: %v)", addr, timeout, res)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// sample is one series of an instant query's vector.
type sample struct {
	Metric map[string]string
	Value  float64
}

// series is one series of a range query's matrix.
type series struct {
	Metric map[string]string
	Values []float64
}

type apiResponse struct {
	Status    string          `json:"status"`
	Data      json.RawMessage `json:"data"`
	ErrorType string          `json:"errorType"`
	Error     string          `json:"error"`
}

func (m *monitor) get(ctx context.Context, path string, params url.Values, into any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, m.promURL+path+"?"+params.Encode(), nil)
	if err != nil {
		return err
	}
	resp, err := m.client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	var r apiResponse
	if err := json.Unmarshal(body, &r); err != nil {
		return fmt.Errorf("GET %s: %s: %.200s", path, resp.Status, body)
	}
	if r.Status != "success" {
		return fmt.Errorf("GET %s %s: %s: %s", path, params.Get("query"), r.ErrorType, r.Error)
	}
	return json.Unmarshal(r.Data, into)
}

// query runs an instant query (at now when at is zero).
func (m *monitor) query(ctx context.Context, expr string, at time.Time) ([]sample, error) {
	p := url.Values{"query": {expr}}
	if !at.IsZero() {
		p.Set("time", strconv.FormatFloat(float64(at.UnixMilli())/1000, 'f', 3, 64))
	}
	var data struct {
		ResultType string            `json:"resultType"`
		Result     []json.RawMessage `json:"result"`
	}
	if err := m.get(ctx, "/api/v1/query", p, &data); err != nil {
		return nil, err
	}
	var out []sample
	for _, raw := range data.Result {
		var s struct {
			Metric map[string]string `json:"metric"`
			Value  [2]any            `json:"value"`
		}
		if data.ResultType == "scalar" {
			var v [2]any
			if err := json.Unmarshal(raw, &v); err == nil {
				out = append(out, sample{Value: parseValue(v[1])})
			}
			continue
		}
		if err := json.Unmarshal(raw, &s); err != nil {
			return nil, err
		}
		out = append(out, sample{Metric: s.Metric, Value: parseValue(s.Value[1])})
	}
	return out, nil
}

// queryRange runs a range query.
func (m *monitor) queryRange(ctx context.Context, expr string, start, end time.Time, step time.Duration) ([]series, error) {
	p := url.Values{"query": {expr}, "start": {strconv.FormatInt(start.Unix(), 10)}, "end": {strconv.FormatInt(end.Unix(), 10)},
		"step": {strconv.FormatFloat(step.Seconds(), 'f', -1, 64)}}
	var data struct {
		Result []struct {
			Metric map[string]string `json:"metric"`
			Values [][2]any          `json:"values"`
		} `json:"result"`
	}
	if err := m.get(ctx, "/api/v1/query_range", p, &data); err != nil {
		return nil, err
	}
	out := make([]series, 0, len(data.Result))
	for _, r := range data.Result {
		s := series{Metric: r.Metric}
		for _, v := range r.Values {
			s.Values = append(s.Values, parseValue(v[1]))
		}
		out = append(out, s)
	}
	return out, nil
}

// parseValue parses Prometheus's string-encoded sample value (NaN when it is none).
func parseValue(v any) float64 {
	s, _ := v.(string)
	f, err := strconv.ParseFloat(s, 64)
	if err != nil {
		return math.NaN()
	}
	return f
}

// labelValues lists a label's values over series matching match, in
// [start, end] (what a Grafana label_values variable offers).
func (m *monitor) labelValues(ctx context.Context, label, match string, start, end time.Time) ([]string, error) {
	var out []string
	err := m.get(ctx, "/api/v1/label/"+label+"/values", url.Values{"match[]": {match},
		"start": {strconv.FormatInt(start.Unix(), 10)}, "end": {strconv.FormatInt(end.Unix(), 10)}}, &out)
	return out, err
}

// seriesCount counts the series of metric name in [start, end] (a
// histogram's are its _bucket, _sum and _count series).
func (m *monitor) seriesCount(ctx context.Context, name string, start, end time.Time) (int, error) {
	var out []map[string]string
	err := m.get(ctx, "/api/v1/series", url.Values{"match[]": {fmt.Sprintf(`{__name__=~%q}`, name+"(_bucket|_sum|_count)?")},
		"start": {strconv.FormatInt(start.Unix(), 10)}, "end": {strconv.FormatInt(end.Unix(), 10)}}, &out)
	return len(out), err
}

// loadedRule is an alerting rule as Prometheus loaded it.
type loadedRule struct {
	Name     string  `json:"name"`
	Query    string  `json:"query"`
	Duration float64 `json:"duration"`
	Health   string  `json:"health"`
	Error    string  `json:"lastError"`
	State    string  `json:"state"`
}

// rules lists the alerting rules Prometheus runs.
func (m *monitor) rules(ctx context.Context) ([]loadedRule, error) {
	var data struct {
		Groups []struct {
			Rules []loadedRule `json:"rules"`
		} `json:"groups"`
	}
	if err := m.get(ctx, "/api/v1/rules", url.Values{"type": {"alert"}}, &data); err != nil {
		return nil, err
	}
	var out []loadedRule
	for _, g := range data.Groups {
		out = append(out, g.Rules...)
	}
	return out, nil
}

// active lists the alerts Prometheus has pending or firing.
func (m *monitor) active(ctx context.Context) ([]activeAlert, error) {
	var data struct {
		Alerts []activeAlert `json:"alerts"`
	}
	err := m.get(ctx, "/api/v1/alerts", nil, &data)
	return data.Alerts, err
}

type activeAlert struct {
	Labels map[string]string `json:"labels"`
	State  string            `json:"state"`
}

// notification is one alert of one Alertmanager webhook notification.
type notification struct {
	At     time.Time
	Status string // firing or resolved
	Labels map[string]string
}

// webhook is the loopback receiver Alertmanager notifies: it records every
// alert of every notification with the time it arrived.
type webhook struct {
	srv *http.Server
	url string
	wg  sync.WaitGroup

	mu    sync.Mutex
	notes []notification
}

func startWebhook() (*webhook, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	w := &webhook{url: "http://" + ln.Addr().String() + "/alerts"}
	w.srv = &http.Server{Handler: http.HandlerFunc(w.serve), ReadHeaderTimeout: 5 * time.Second}
	w.wg.Go(func() {
		if err := w.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			fmt.Fprintln(os.Stderr, "alerts: webhook:", err)
		}
	})
	return w, nil
}

func (w *webhook) serve(rw http.ResponseWriter, r *http.Request) {
	at := time.Now()
	var msg struct {
		Alerts []struct {
			Status string            `json:"status"`
			Labels map[string]string `json:"labels"`
		} `json:"alerts"`
	}
	if err := json.NewDecoder(r.Body).Decode(&msg); err != nil {
		http.Error(rw, err.Error(), http.StatusBadRequest)
		return
	}
	w.mu.Lock()
	for _, a := range msg.Alerts {
		w.notes = append(w.notes, notification{At: at, Status: a.Status, Labels: a.Labels})
	}
	w.mu.Unlock()
}

func (w *webhook) close() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = w.srv.Shutdown(ctx)
	w.wg.Wait()
}

// first returns the first notification after since with status whose
// labels include match.
func (w *webhook) first(status string, match map[string]string, since time.Time) (notification, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, n := range w.notes {
		if n.Status == status && !n.At.Before(since) && matches(n.Labels, match) {
			return n, true
		}
	}
	return notification{}, false
}

// all returns a copy of every notification so far.
func (w *webhook) all() []notification {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]notification(nil), w.notes...)
}

func matches(labels, match map[string]string) bool {
	for k, v := range match {
		if labels[k] != v {
			return false
		}
	}
	return true
}

// labelString renders labels as {a="b", …} without the noisy ones.
func labelString(l map[string]string) string {
	var keys []string
	for k := range l {
		if k != "alertname" && k != "severity" && k != "namespace" {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	var b bytes.Buffer
	for i, k := range keys {
		if i > 0 {
			b.WriteString(",")
		}
		fmt.Fprintf(&b, "%s=%q", k, l[k])
	}
	if b.Len() == 0 {
		return ""
	}
	return "{" + b.String() + "}"
}
