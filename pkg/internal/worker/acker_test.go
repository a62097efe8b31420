package worker

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

type ackRecorder struct{ acks [][2]uint64 }

func (r *ackRecorder) Ack(tag uint64, multiple bool) error {
	m := uint64(0)
	if multiple {
		m = 1
	}
	r.acks = append(r.acks, [2]uint64{tag, m})
	return nil
}

func TestAckerAcksOnlyContiguousSettledRuns(t *testing.T) {
	rec := &ackRecorder{}
	a := &acker{ch: rec, next: 1, settled: map[uint64]bool{}}
	require.NoError(t, a.settle(2, 3))
	assert.Empty(t, rec.acks, "tag 1 is not settled: nothing may be acked")
	require.NoError(t, a.settle(1))
	assert.Equal(t, [][2]uint64{{3, 1}}, rec.acks, "1..3 in one multiple ack")
	assert.NoError(t, a.settle(5))
	assert.NoError(t, a.settle(4, 6))
	assert.Equal(t, [][2]uint64{{3, 1}, {6, 1}}, rec.acks)
	require.NoError(t, a.settle(3), "a tag already acked is ignored")
	assert.Len(t, rec.acks, 2)
	assert.Empty(t, a.settled)
}
