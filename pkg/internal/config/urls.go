package config

import (
	"errors"
	"fmt"
	"net/url"
	"regexp"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"
)

// The parsers of the connection URLs quote the whole URL in their errors,
// user info and all, and what most often makes one fail is a password with
// an unencoded '/', '?' or '#': the parser then takes part of the password
// for the port and quotes that too. So the checks below never pass a
// parser's error on as it is: they keep the parser's words, drop every
// quoted value, and drop the words too if they still hold a piece of the
// user info (urlReason). eventsctl uses the same checks for its flags.

// CheckAMQPURL reports whether raw, an AMQP_URL, is one amqp:// or amqps://
// URL or the comma-separated URLs of a cluster's nodes, all naming one
// vhost. Its error repeats no part of raw.
func CheckAMQPURL(raw string) error {
	nodes := strings.Split(raw, ",")
	vhosts := map[string]bool{}
	for i, node := range nodes {
		node = strings.TrimSpace(node)
		uri, err := amqp.ParseURI(node)
		if err != nil {
			reason := urlReason(node, err)
			if node == "" {
				reason = "empty"
			}
			if len(nodes) > 1 {
				reason = fmt.Sprintf("node %d of %d: %s", i+1, len(nodes), reason)
			}
			return fmt.Errorf("not a valid AMQP URL, or comma-separated list of the URLs of a cluster's nodes (%s)", reason)
		}
		vhosts[uri.Vhost] = true
	}
	if len(vhosts) > 1 {
		return errors.New("the nodes' URLs name different vhosts; a cluster's nodes serve one vhost")
	}
	return nil
}

// CheckDatabaseURL reports whether raw, a DATABASE_URL, is a PostgreSQL
// URL or keyword/value string that pgxpool, which the binaries open it with,
// accepts: pgxpool reads settings of its own (pool_max_conns, …) that a
// plain pgconn.ParseConfig would let through to fail at start. Its error
// repeats no part of raw.
func CheckDatabaseURL(raw string) error {
	if raw == "" {
		return errors.New("must not be empty")
	}
	if _, err := pgxpool.ParseConfig(raw); err != nil {
		return fmt.Errorf("not a valid PostgreSQL connection string (%s)", urlReason(raw, err))
	}
	return nil
}

// CheckManagementURL reports whether raw, a RABBITMQ_MANAGEMENT_URL, is
// "auto", "off" or an http(s) URL. Its error repeats no part of raw.
func CheckManagementURL(raw string) error {
	if raw == "auto" || raw == "off" {
		return nil
	}
	u, err := url.Parse(raw)
	var reason string
	switch {
	case err != nil:
		reason = urlReason(raw, err)
	case u.Scheme != "http" && u.Scheme != "https":
		reason = "the scheme must be http:// or https://"
	case u.Host == "":
		reason = "missing host"
	default:
		return nil
	}
	return fmt.Errorf("must be auto, off, or an http(s) URL (%s)", reason)
}

// redisURLError is ParseRedisURL's error: "not a valid Redis URL (reason)".
func redisURLError(raw string, err error) error {
	return fmt.Errorf("not a valid Redis URL (%s)", urlReason(raw, err))
}

var (
	quotedValue = regexp.MustCompile("\\s*(\"[^\"]*\"|`[^`]*`)")
	// strconv's and time's errors name the value they failed on, which is
	// gone once quoted values are dropped: "strconv.ParseInt: parsing :
	// invalid syntax" says no more than "invalid syntax".
	goPrefix = regexp.MustCompile(`(strconv\.\w+: parsing\s*:\s*|time: )`)
	// danglingColon is what dropping a quoted value at the end leaves:
	// "invalid database number:".
	danglingColon = regexp.MustCompile(`:\s*(\)|$)`)
	// passwordKV finds the user and password of a keyword/value string
	// and credentials passed as query parameters (sslpassword=…).
	passwordKV = regexp.MustCompile(`(?i)(?:^|[\s?&;])\w*(?:password|user|username)\s*=\s*('[^']*'|[^\s&;]*)`)
)

// urlReason says in words why raw did not parse, given the parser's err:
// the parser's words without the values it quotes, and with a hint when
// the user info holds a character that must be percent-encoded. It never
// returns a piece of raw's user info: if the parser's words still hold one,
// they are replaced by a word of ours.
func urlReason(raw string, err error) string {
	reason := parserWords(err)
	reason = quotedValue.ReplaceAllString(reason, "")
	reason = goPrefix.ReplaceAllString(reason, "")
	reason = danglingColon.ReplaceAllString(strings.Join(strings.Fields(reason), " "), "$1")
	for _, part := range userInfoParts(raw) {
		if strings.Contains(reason, part) {
			reason = "malformed"
			break
		}
	}
	if reason == "" {
		reason = "malformed"
	}
	if hint := encodingHint(raw); hint != "" {
		reason += "; " + hint
	}
	return reason
}

// parserWords is err's text without the URL the parser wrapped around it.
func parserWords(err error) string {
	var pce *pgconn.ParseConfigError
	if errors.As(err, &pce) && pce != nil {
		// Its text is "cannot parse `<URL, password masked>`: <reason>";
		// the masking is best effort and leaves the user name.
		bare := *pce
		bare.ConnString = ""
		return strings.TrimPrefix(bare.Error(), "cannot parse ``: ")
	}
	var ue *url.Error
	if errors.As(err, &ue) && ue != nil && ue.Err != nil {
		// amqp091 wraps it in a hint that quotes the reserved characters;
		// encodingHint gives our own.
		return ue.Err.Error()
	}
	return strings.TrimPrefix(err.Error(), "redis: ")
}

// userInfoParts are the pieces of raw that may be a user name or password,
// at least 4 characters long (shorter ones would match ordinary words): the
// user info of a URL, found the lenient way (everything between "://" and
// the last '@', since the '/' or '#' that broke the URL may sit in the
// password), split at the characters that delimit URL parts, and the values
// of user and password keywords and query parameters.
func userInfoParts(raw string) []string {
	var candidates []string
	if ui, ok := userInfo(raw); ok {
		candidates = append(candidates, ui)
	}
	for _, m := range passwordKV.FindAllStringSubmatch(raw, -1) {
		candidates = append(candidates, strings.Trim(m[1], "'"))
	}
	var parts []string
	for _, c := range candidates {
		pieces := strings.FieldsFunc(c, func(r rune) bool { return strings.ContainsRune(":/?#@%&= \t", r) })
		for _, p := range append(pieces, c) {
			if len(p) >= 4 {
				parts = append(parts, p)
			}
		}
	}
	return parts
}

// userInfo is what stands between raw's "://" and its last '@'.
func userInfo(raw string) (string, bool) {
	_, rest, ok := strings.Cut(raw, "://")
	if !ok {
		return "", false
	}
	i := strings.LastIndex(rest, "@")
	if i < 0 {
		return "", false
	}
	return rest[:i], true
}

// encodingHint names a character of raw's user info that URLs reserve and
// the user info must percent-encode, or is "".
func encodingHint(raw string) string {
	ui, ok := userInfo(raw)
	if !ok {
		return ""
	}
	for _, c := range []struct{ char, code string }{{"/", "%2F"}, {"?", "%3F"}, {"#", "%23"}, {"@", "%40"}} {
		if strings.Contains(ui, c.char) {
			return fmt.Sprintf("an unencoded '%s' in the user name or password? percent-encode it as %s", c.char, c.code)
		}
	}
	if badEscape(ui) {
		return "a '%' in the user name or password must be percent-encoded as %25"
	}
	return ""
}

// badEscape reports whether s has a '%' not followed by two hex digits.
func badEscape(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] != '%' {
			continue
		}
		if i+2 >= len(s) || !isHex(s[i+1]) || !isHex(s[i+2]) {
			return true
		}
		i += 2
	}
	return false
}

func isHex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}
