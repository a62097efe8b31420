package webhook

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"strings"
)

// GitHub webhook headers.
const (
	GitHubSignatureHeader = "X-Hub-Signature-256"
	GitHubDeliveryHeader  = "X-GitHub-Delivery"
	GitHubEventHeader     = "X-GitHub-Event"
)

// GitHubVerifier checks X-Hub-Signature-256: "sha256=" + hex HMAC-SHA256 of
// the raw body under the webhook secret. GitHub signs no timestamp, so a
// replay is caught by the dedupe on X-GitHub-Delivery, not here.
type GitHubVerifier struct {
	secrets [][]byte
}

// NewGitHubVerifier returns a verifier for secrets.
func NewGitHubVerifier(secrets []string) *GitHubVerifier {
	v := &GitHubVerifier{}
	for _, s := range secrets {
		v.secrets = append(v.secrets, []byte(s))
	}
	return v
}

// Scheme implements Verifier.
func (v *GitHubVerifier) Scheme() string { return SchemeGitHub }

// Verify implements Verifier.
func (v *GitHubVerifier) Verify(h http.Header, body []byte) (int, error) {
	header := h.Get(GitHubSignatureHeader)
	if header == "" {
		return -1, &Error{Reason: ReasonMissing, Detail: "no " + GitHubSignatureHeader + " header"}
	}
	hexSig, ok := strings.CutPrefix(header, "sha256=")
	if !ok || len(hexSig) != 2*sha256.Size {
		return -1, &Error{Reason: ReasonMalformed, Detail: GitHubSignatureHeader + " is not sha256=<64 hex digits>"}
	}
	sig, err := hex.DecodeString(hexSig)
	if err != nil {
		return -1, &Error{Reason: ReasonMalformed, Detail: GitHubSignatureHeader + " is not sha256=<64 hex digits>"}
	}
	matched := -1
	for i, secret := range v.secrets {
		m := hmac.New(sha256.New, secret)
		m.Write(body)
		if hmac.Equal(m.Sum(nil), sig) && matched < 0 {
			matched = i
		}
	}
	if matched < 0 {
		return -1, &Error{Reason: ReasonMismatch, Detail: "the signature does not match the body under any configured secret"}
	}
	return matched, nil
}

// SignGitHub returns an X-Hub-Signature-256 value for body, as GitHub sends it.
func SignGitHub(secret string, body []byte) string {
	m := hmac.New(sha256.New, []byte(secret))
	m.Write(body)
	return "sha256=" + hex.EncodeToString(m.Sum(nil))
}
