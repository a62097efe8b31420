package config_test

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idempotent-events/idempotent-events/pkg/internal/config"
)

func TestAdminIsOffWithoutAToken(t *testing.T) {
	cleanEnv(t)
	var c config.Worker
	require.NoError(t, config.Load(&c))
	assert.False(t, c.AdminEnabled())
	assert.Equal(t, ":9092", c.AdminAddr)
	assert.Equal(t, "admin-api", c.AdminOperator)
	assert.Equal(t, 20.0, c.AdminReplayRate)
	assert.Equal(t, 1000, c.AdminScanLimit)
	assert.Equal(t, 8*time.Hour, c.AdminSessionTTL)

	t.Setenv("ADMIN_TOKEN", "a-long-enough-admin-token")
	require.NoError(t, config.Load(&c))
	assert.True(t, c.AdminEnabled())
}

func TestInvalidAdminValuesNameTheVariable(t *testing.T) {
	cases := map[string]string{
		"ADMIN_ADDR":           "9092",
		"ADMIN_TOKEN":          "short",
		"ADMIN_OPERATOR":       strings.Repeat("x", 65),
		"ADMIN_REPLAY_RATE":    "0",
		"ADMIN_DLQ_SCAN_LIMIT": "0",
		"ADMIN_SESSION_TTL":    "1s",
	}
	requireEachNamed(t, cases)
}

func TestTheAdminTokenIsNotEchoed(t *testing.T) {
	requireNotEchoed(t, "ADMIN_TOKEN", "s3cret ", "s3cret")
}
