package admin_test

import (
	"context"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idempotent-events/idempotent-events/pkg/internal/broker"
	"github.com/idempotent-events/idempotent-events/pkg/internal/dlq"
	"github.com/idempotent-events/idempotent-events/pkg/internal/pipelinetest"
)

const chromiumPath = "/usr/bin/chromium"

// chromium returns Debian's Chromium, installing it with
// hack/install-browser.sh when it is missing (make test does that first).
// The test is skipped only when it is missing and cannot be installed.
func chromium(t *testing.T) string {
	t.Helper()
	if _, err := os.Stat(chromiumPath); err == nil {
		return chromiumPath
	}
	out, err := exec.Command("../../../hack/install-browser.sh").CombinedOutput()
	if _, serr := os.Stat(chromiumPath); err != nil || serr != nil {
		t.Skipf("SKIPPED browser test: %s is missing and hack/install-browser.sh could not install it (%v): %s",
			chromiumPath, err, strings.TrimSpace(string(out)))
	}
	return chromiumPath
}

// artifacts is where the screenshots go: $TEST_ARTIFACTS, or
// bin/test-artifacts (bin/ is git-ignored).
func artifacts(t *testing.T) string {
	t.Helper()
	dir := os.Getenv("TEST_ARTIFACTS")
	if dir == "" {
		dir = "../../../bin/test-artifacts"
	}
	dir, err := filepath.Abs(dir)
	require.NoError(t, err)
	require.NoError(t, os.MkdirAll(dir, 0o755))
	return dir
}

// The DLQ page in a real browser (headless Chromium): unauthenticated it
// is a 401 sign-in form; signed in, it lists the DLQ messages with their
// reason and attempts, and replays and discards a message through a
// confirmation step. Screenshots are written to artifacts.
func TestTheDLQPageInABrowser(t *testing.T) {
	if testing.Short() {
		t.Skip("-short (make check): the browser test runs in make test")
	}
	t.Parallel()
	exe := chromium(t)
	shots := artifacts(t)

	p := pipelinetest.New(t)
	p.StartWorker(pipelinetest.Token)
	p.Block("evt_web1", "evt_web2")
	p.PublishEvent("evt_web1")
	p.PublishEvent("evt_web2")
	p.Publish("", "", []byte(`{"id":"evt_web_poison","type":"payment_intent.succeeded","data":{}}`))
	p.Eventually(func() bool { return p.Depth(broker.DLQ) == 3 }, "three messages in the DLQ")
	p.Unblock()
	var l dlq.Listing
	require.Equal(t, http.StatusOK, call(t, p, http.MethodGet, "/api/dlq", "", nil, &l))
	id := map[string]string{}
	for _, m := range l.Messages {
		id[m.EventID] = m.ID
	}
	require.Len(t, id, 3)
	base := "http://" + p.AdminAddr

	// Unauthenticated: 401, and the body is the sign-in form.
	resp, err := httpClient.Get(base + "/ui/dlq")
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	assert.Equal(t, http.StatusUnauthorized, resp.StatusCode)
	assert.Contains(t, string(body), `id="login"`)

	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(exe),
		chromedp.Headless,
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.NoFirstRun,
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-quic", true),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1440, 1000),
	)
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	defer cancelAlloc()
	ctx, cancelTab := chromedp.NewContext(allocCtx)
	defer cancelTab()
	ctx, cancelTimeout := context.WithTimeout(ctx, 2*time.Minute)
	defer cancelTimeout()

	do := func(what string, steps ...chromedp.Action[chromedp.Void]) {
		t.Helper()
		require.NoError(t, chromedp.Do(ctx, steps...), what)
	}
	text := func(sel string) string {
		t.Helper()
		s, err := chromedp.Run(ctx, chromedp.Text(chromedp.CSS(sel)))
		require.NoError(t, err, "text of %s", sel)
		return s
	}
	rows := func() int {
		t.Helper()
		n, err := chromedp.Run(ctx, chromedp.Evaluate[int](`document.querySelectorAll("#dlq-table tbody tr").length`))
		require.NoError(t, err)
		return n
	}
	shot := func(name string) {
		t.Helper()
		png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
		require.NoError(t, err, "screenshot")
		path := filepath.Join(shots, name)
		require.NoError(t, os.WriteFile(path, png, 0o644))
		t.Logf("screenshot: %s", path)
	}

	// Sign in.
	do("open the page and sign in",
		chromedp.Navigate(base+"/ui/dlq"),
		chromedp.WaitVisible(chromedp.ID("login")),
		chromedp.SendKeys(chromedp.ID("operator-name"), "Grace Hopper"),
		chromedp.SendKeys(chromedp.ID("token"), pipelinetest.Token),
		chromedp.Click(chromedp.ID("sign-in")),
		chromedp.WaitVisible(chromedp.ID("dlq-table")),
	)
	assert.Equal(t, "Grace Hopper", text("#operator"))
	assert.Equal(t, 3, rows())
	row := func(event string) string { return `#dlq-table tr[data-dlq-id="` + id[event] + `"]` }
	assert.Contains(t, text(row("evt_web1")), "rejected_by_database")
	assert.Contains(t, text(row("evt_web_poison")), "invalid_payload")
	assert.Contains(t, text(row("evt_web1")+" td.num"), "1", "attempts")
	shot("dlq-page.png")

	// Replay evt_web1: the button leads to a confirmation, cancel keeps it.
	do("replay, then cancel",
		chromedp.Click(chromedp.CSS(row("evt_web1")+" a.replay")),
		chromedp.WaitVisible(chromedp.ID("confirm")),
	)
	assert.Contains(t, text("#confirm-box"), "events.replay")
	shot("dlq-confirm-replay.png")
	do("cancel", chromedp.Click(chromedp.ID("cancel")), chromedp.WaitVisible(chromedp.ID("dlq-table")))
	assert.Equal(t, 3, rows(), "cancel changed nothing")
	assert.Equal(t, 3, p.Depth(broker.DLQ))

	do("replay and confirm",
		chromedp.Click(chromedp.CSS(row("evt_web1")+" a.replay")),
		chromedp.WaitVisible(chromedp.ID("confirm")),
		chromedp.Click(chromedp.ID("confirm")),
		chromedp.WaitVisible(chromedp.ID("flash")),
	)
	assert.Contains(t, text("#flash"), "Replayed "+id["evt_web1"])
	assert.Equal(t, 2, rows())
	p.Eventually(func() bool { payments, _ := p.Rows("evt_web1"); return payments == 1 }, "the replayed event was processed")

	// Discard the poison from its detail page.
	do("discard from the detail page",
		chromedp.Click(chromedp.CSS(row("evt_web_poison")+" td a")),
		chromedp.WaitVisible(chromedp.ID("body")),
		chromedp.Click(chromedp.CSS("p.actions a.discard")),
		chromedp.WaitVisible(chromedp.ID("confirm")),
	)
	assert.Contains(t, text("#body"), "evt_web_poison")
	do("confirm the discard", chromedp.Click(chromedp.ID("confirm")), chromedp.WaitVisible(chromedp.ID("flash")))
	assert.Contains(t, text("#flash"), "Discarded "+id["evt_web_poison"])
	assert.Equal(t, 1, rows())
	audit := text("#audit-table")
	assert.Contains(t, audit, "Grace Hopper")
	assert.Contains(t, audit, "discarded")
	assert.Contains(t, audit, "replayed")
	shot("dlq-page-after.png")

	// Signing out ends the session: the page is a 401 sign-in form again.
	do("sign out", chromedp.Click(chromedp.CSS("form.signout button")), chromedp.WaitVisible(chromedp.ID("login")),
		chromedp.Navigate(base+"/ui/dlq"), chromedp.WaitVisible(chromedp.ID("login")))

	assert.Equal(t, 1, p.Depth(broker.DLQ))
	var web []pipelinetest.AuditRow
	for _, r := range p.Audit() {
		if r.Via == "web" {
			web = append(web, r)
		}
	}
	require.Len(t, web, 2)
	assert.Equal(t, pipelinetest.AuditRow{Operator: "Grace Hopper", Via: "web", Action: "replay", DLQID: id["evt_web1"],
		EventID: "evt_web1", Reason: "rejected_by_database", Outcome: "replayed"}, web[0])
	assert.Equal(t, "discarded", web[1].Outcome)
	assert.Equal(t, id["evt_web_poison"], web[1].DLQID)
	p.Invariant()
}
