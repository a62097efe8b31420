package app

import (
	"errors"
	"strings"

	"github.com/idempotent-events/idempotent-events/pkg/internal/config"
	"github.com/idempotent-events/idempotent-events/pkg/internal/tlsconfig"
)

// serviceTLS holds the TLS of the connections to the three services; a
// nil one has no TLS settings (the libraries' defaults for its URL).
type serviceTLS struct {
	amqp, redis, db *tlsconfig.Client
}

// loadTLS reads the TLS files of c's services that need is true for
// (amqp, redis, db). A file that is missing or does not parse is a
// *config.Error naming its variable, so the binary exits 2 as for any bad
// setting; it is read here, at the start, not by --check-config (the
// files exist only where they are mounted).
func loadTLS(c config.Connections, redis, db bool) (serviceTLS, error) {
	var s serviceTLS
	var errs []error
	var err error
	s.amqp, err = newTLS(tlsconfig.RabbitMQ, c.AMQPTLSSettings())
	errs = append(errs, err)
	if redis {
		s.redis, err = newTLS(tlsconfig.Redis, c.RedisTLSSettings())
		errs = append(errs, err)
	}
	if db {
		s.db, err = newTLS(tlsconfig.Postgres, c.DatabaseTLSSettings())
		errs = append(errs, err)
	}
	return s, joinProblems(errs...)
}

// newTLS is tlsconfig.New of settings t, with its errors as a *config.Error.
func newTLS(s tlsconfig.Service, t config.TLS) (*tlsconfig.Client, error) {
	c, err := tlsconfig.New(s, tlsconfig.Files{CAFile: t.CAFile, CertFile: t.CertFile, KeyFile: t.KeyFile, Required: t.Required})
	return c, joinProblems(err)
}

// joinProblems makes one *config.Error of the tlsconfig.FileErrors in
// errs (joined or not); any other error is returned as it is.
func joinProblems(errs ...error) error {
	var problems []config.Problem
	var other []error
	var walk func(error)
	walk = func(err error) {
		if err == nil {
			return
		}
		var fe *tlsconfig.FileError
		if multi, ok := err.(interface{ Unwrap() []error }); ok {
			for _, e := range multi.Unwrap() {
				walk(e)
			}
			return
		}
		var cerr *config.Error
		switch {
		case errors.As(err, &fe):
			msg := fe.Err.Error()
			if !strings.Contains(msg, fe.Path) {
				msg = fe.Path + ": " + msg
			}
			problems = append(problems, config.Problem{Var: fe.Var, Msg: msg})
		case errors.As(err, &cerr):
			problems = append(problems, cerr.Problems...)
		default:
			other = append(other, err)
		}
	}
	for _, err := range errs {
		walk(err)
	}
	if len(other) > 0 {
		return errors.Join(other...)
	}
	if len(problems) > 0 {
		return &config.Error{Problems: problems}
	}
	return nil
}
