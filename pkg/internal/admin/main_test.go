package admin_test

import (
	"testing"

	"go.uber.org/goleak"
)

// Every goroutine a test starts (the worker's, the admin server's, the
// browser driver's) must be stopped by the time it ends.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
