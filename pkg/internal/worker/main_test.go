package worker_test

import (
	"testing"

	"go.uber.org/goleak"
)

// Every goroutine a test starts must be stopped by the time it ends.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
