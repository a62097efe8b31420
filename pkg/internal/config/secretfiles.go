package config

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"
)

// WebhookSecretFiles are the receiver's settings for webhook secrets read
// from files (a Kubernetes Secret mounted as a volume) instead of
// variables: the files are read again on an interval, so a rotation needs
// no restart (pkg/internal/webhooksecrets).
type WebhookSecretFiles struct {
	// WebhookSecretsFile names a file holding the default route's secrets,
	// comma- or newline-separated; it replaces WEBHOOK_SECRETS. Each
	// WEBHOOK_SOURCES source has WEBHOOK_SECRETS_<NAME>_FILE likewise.
	WebhookSecretsFile string `envconfig:"WEBHOOK_SECRETS_FILE"`
	// WebhookSecretsReload is how often the files are read again.
	WebhookSecretsReload time.Duration `envconfig:"WEBHOOK_SECRETS_RELOAD_INTERVAL" default:"5s"`
}

// SecretsFileVar is the variable naming the file a variable's secrets may
// be read from instead: WEBHOOK_SECRETS_FILE, WEBHOOK_SECRETS_<NAME>_FILE.
func SecretsFileVar(secretsVar string) string { return secretsVar + "_FILE" }

// readSecretsFile reads the secrets of fileVar's file into *secrets, unless
// secretsVar is set too (one source of secrets only), and reports a
// problem naming fileVar when it cannot. The problem names the file and the
// cause, never its content.
func readSecretsFile(p *problems, secretsVar, fileVar, path string, secrets *[]string) {
	if len(*secrets) > 0 {
		p.add(fileVar, "must not be set together with %s: the secrets come from one of them", secretsVar)
		return
	}
	s, err := ReadSecretsFile(path)
	if err != nil {
		p.add(fileVar, "%v", err)
		return
	}
	*secrets = s
}

func (f *WebhookSecretFiles) validate(p *problems) {
	if f.WebhookSecretsReload < 100*time.Millisecond {
		p.add("WEBHOOK_SECRETS_RELOAD_INTERVAL", "must be at least 100ms, got %s", f.WebhookSecretsReload)
	}
}

// ParseSecrets splits the content of a secrets file: secrets separated by
// commas or line breaks (a Secret written with a trailing newline, or one
// secret a line), blanks around each ignored, empty items dropped.
func ParseSecrets(content []byte) []string {
	var out []string
	for _, item := range strings.FieldsFunc(string(content), func(r rune) bool { return r == ',' || r == '\n' || r == '\r' }) {
		if s := strings.TrimSpace(item); s != "" {
			out = append(out, s)
		}
	}
	return out
}

// ErrNoSecret is the error of a secrets file that holds no secret.
var ErrNoSecret = errors.New("holds no secret (comma- or newline-separated secrets expected)")

// maxSecretsFile bounds a secrets file: a few secrets take a few hundred
// bytes; anything near this is a wrong path (a log, a binary).
const maxSecretsFile = 64 << 10

// ReadSecretsFile reads and parses the secrets file at path. Its error
// names the path and what is wrong, never the content.
func ReadSecretsFile(path string) ([]string, error) {
	_, secrets, err := LoadSecretsFile(path)
	return secrets, err
}

// LoadSecretsFile is ReadSecretsFile that also returns the raw content, to
// tell a changed file from an unchanged one.
func LoadSecretsFile(path string) ([]byte, []string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, nil, err // an *os.PathError: the path and the cause
	}
	defer f.Close()
	content, err := io.ReadAll(io.LimitReader(f, maxSecretsFile+1))
	if err != nil {
		return nil, nil, err
	}
	if len(content) > maxSecretsFile {
		return nil, nil, fmt.Errorf("%s is larger than %d bytes: not a secrets file", path, maxSecretsFile)
	}
	secrets := ParseSecrets(content)
	if len(secrets) == 0 {
		return nil, nil, fmt.Errorf("%s %w", path, ErrNoSecret)
	}
	return content, secrets, nil
}
