package webhooksecrets

import "github.com/idempotent-events/idempotent-events/pkg/internal/config"

// The format of a secrets file is the configuration's (config.ParseSecrets):
// the receiver reads each file once at start with the other settings, then
// the Watcher reads it again as it changes.

// Parse splits the content of a secrets file (config.ParseSecrets).
func Parse(content []byte) []string { return config.ParseSecrets(content) }

// ErrEmpty is the error of a secrets file that holds no secret.
var ErrEmpty = config.ErrNoSecret

// Read reads the secrets file at path. Its error names the path and what
// is wrong, never the content.
func Read(path string) ([]string, error) { return config.ReadSecretsFile(path) }

func load(path string) ([]byte, []string, error) { return config.LoadSecretsFile(path) }
