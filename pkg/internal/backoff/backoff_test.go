package backoff

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestJitterStaysInUpperHalf(t *testing.T) {
	for _, d := range []time.Duration{0, 1, 2, 7, 100 * time.Millisecond, 10 * time.Second} {
		lowerHalf := 0
		for range 2000 {
			got := Jitter(d)
			require.GreaterOrEqual(t, got, d/2, "Jitter(%v)", d)
			require.LessOrEqual(t, got, d, "Jitter(%v)", d)
			if got < d/2+d/4 {
				lowerHalf++
			}
		}
		if d >= 100*time.Millisecond {
			// The waits spread over the whole range instead of sitting at one end.
			require.Greater(t, lowerHalf, 500, "Jitter(%v)", d)
			require.Less(t, lowerHalf, 1500, "Jitter(%v)", d)
		}
	}
}

func TestSleepEndsWithItsContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	require.False(t, Sleep(ctx, time.Hour), "a cancelled context must end the wait and say so")
	require.True(t, Sleep(context.Background(), time.Millisecond))
}
