package eventsctl

import (
	"fmt"

	"github.com/idempotent-events/idempotent-events/pkg/internal/config"
)

// checkURL checks a connection URL before a command hands it to a client:
// the clients' own parse errors quote the URL, password and all, where
// config's checks say what is wrong in words only. The error names the
// variable and the flag value may have come from; a command reports it with
// status 2, as a bad flag.
func checkURL(variable, flagName, value string, check func(string) error) error {
	if err := check(value); err != nil {
		return fmt.Errorf("%s (or -%s): %w", variable, flagName, err)
	}
	return nil
}

func checkAMQPURL(value string) error {
	return checkURL("AMQP_URL", "amqp-url", value, config.CheckAMQPURL)
}

func checkDatabaseURL(value string) error {
	return checkURL("DATABASE_URL", "database-url", value, config.CheckDatabaseURL)
}

func checkManagementURL(value string) error {
	return checkURL("RABBITMQ_MANAGEMENT_URL", "management-url", value, config.CheckManagementURL)
}
