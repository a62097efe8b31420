package store_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idempotent-events/idempotent-events/pkg/internal/store"
)

func TestDurabilityModes(t *testing.T) {
	for _, c := range []struct {
		d    store.Durability
		want string
	}{
		{store.Durability{}, store.DurabilitySingle},
		{store.Durability{Standbys: 2, SynchronousCommit: "on"}, store.DurabilityAsync},
		{store.Durability{Standbys: 1, SynchronousStandbyNames: "ANY 1 (*)", SynchronousCommit: "on"}, store.DurabilitySync},
		{store.Durability{Standbys: 1, SynchronousStandbyNames: "ANY 1 (*)", SynchronousCommit: "remote_apply"}, store.DurabilitySync},
		// synchronous_commit=local or off: COMMIT does not wait for the standby.
		{store.Durability{Standbys: 1, SynchronousStandbyNames: "s1", SynchronousCommit: "local"}, store.DurabilityAsync},
		{store.Durability{Standbys: 1, SynchronousStandbyNames: "s1", SynchronousCommit: "off"}, store.DurabilityAsync},
		// Named but not connected: COMMIT waits until it is.
		{store.Durability{SynchronousStandbyNames: "s1", SynchronousCommit: "on"}, store.DurabilitySync},
		{store.Durability{InRecovery: true}, store.DurabilityStandby},
	} {
		assert.Equal(t, c.want, c.d.Mode(), "%+v", c.d)
	}
}

// The machine's PostgreSQL has no standby.
func TestReadDurabilityOfASingleServer(t *testing.T) {
	t.Parallel()
	d, err := open(t).ReadDurability(context.Background())
	require.NoError(t, err)
	assert.Equal(t, store.DurabilitySingle, d.Mode(), "%+v", d)
}
