package main

import (
	"context"
	"flag"
	"fmt"
	"strings"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/v0m3/v0m3/internal/identity"
	"github.com/v0m3/v0m3/suite"
)

// identityFlags are the flags that say how a service proves itself to its
// peers (mutual TLS) and how it authenticates product and admin callers
// (bearer tokens).
type identityFlags struct {
	caFile, certFile, keyFile       *string
	insecure                        *bool
	issuer, audience, jwksURL, jwks *string
	skew                            *time.Duration
	groupsClaim                     *string
	tokenReview                     *bool
	tokenReviewAudience             *string
}

func addIdentityFlags(fs *flag.FlagSet) *identityFlags {
	return &identityFlags{
		caFile:              fs.String("tls-ca-file", "", "PEM CA bundle the service trusts (cert-manager Secret key ca.crt)"),
		certFile:            fs.String("tls-cert-file", "", "PEM certificate naming the service (URI SAN spiffe://v0m3/service/<name>)"),
		keyFile:             fs.String("tls-key-file", "", "PEM private key of the certificate"),
		insecure:            fs.Bool("insecure-plaintext", false, "DEVELOPMENT ONLY: serve and dial plaintext; peers are not authenticated"),
		issuer:              fs.String("oidc-issuer", "", "OIDC issuer whose bearer JWTs callers present (iss)"),
		audience:            fs.String("oidc-audience", "v0m3", "audience bearer JWTs must carry (aud)"),
		jwksURL:             fs.String("oidc-jwks-url", "", "URL of the issuer's JWK set"),
		jwks:                fs.String("oidc-jwks-file", "", "file holding the issuer's JWK set (instead of --oidc-jwks-url)"),
		skew:                fs.Duration("oidc-skew", time.Minute, "clock skew tolerated on token times"),
		groupsClaim:         fs.String("oidc-groups-claim", "groups", "claim holding the caller's groups"),
		tokenReview:         fs.Bool("token-review", false, "authenticate Kubernetes ServiceAccount tokens through TokenReview (in-cluster)"),
		tokenReviewAudience: fs.String("token-review-audience", "", "comma-separated audiences ServiceAccount tokens must be valid for"),
	}
}

// authenticator builds the bearer-token authenticators the flags name;
// extra ones (the development issuer) come first.
func (f *identityFlags) authenticator(ctx context.Context, extra ...identity.Authenticator) (identity.Authenticator, error) {
	chain := identity.Chain(extra)
	if *f.issuer != "" {
		j, err := identity.NewJWT(ctx, identity.JWTConfig{
			Issuer: *f.issuer, Audience: *f.audience, JWKSURL: *f.jwksURL, JWKSFile: *f.jwks,
			Skew: *f.skew, GroupsClaim: *f.groupsClaim,
		})
		if err != nil {
			return nil, usageError{err.Error()}
		}
		chain = append(chain, j)
	} else if *f.jwksURL != "" || *f.jwks != "" {
		return nil, usageError{"--oidc-jwks-url/--oidc-jwks-file need --oidc-issuer"}
	}
	if *f.tokenReview {
		cfg, err := rest.InClusterConfig()
		if err != nil {
			return nil, fmt.Errorf("--token-review: %w", err)
		}
		cs, err := kubernetes.NewForConfig(cfg)
		if err != nil {
			return nil, fmt.Errorf("--token-review: %w", err)
		}
		tr := &identity.TokenReview{Client: cs.AuthenticationV1().TokenReviews()}
		if *f.tokenReviewAudience != "" {
			tr.Audiences = strings.Split(*f.tokenReviewAudience, ",")
		}
		chain = append(chain, tr)
	}
	if len(chain) == 0 {
		return nil, nil
	}
	return chain, nil
}

// credentials loads the TLS files, or returns nil when plaintext was
// explicitly chosen.
func (f *identityFlags) credentials() (*identity.Credentials, error) {
	if *f.insecure {
		if *f.caFile != "" || *f.certFile != "" || *f.keyFile != "" {
			return nil, usageError{"--insecure-plaintext cannot be combined with --tls-* files"}
		}
		return nil, nil
	}
	if *f.caFile == "" || *f.certFile == "" || *f.keyFile == "" {
		return nil, usageError{"mutual TLS needs --tls-ca-file, --tls-cert-file and --tls-key-file (or, for development only, --insecure-plaintext)"}
	}
	return identity.LoadFiles(identity.Files{CA: *f.caFile, Cert: *f.certFile, Key: *f.keyFile})
}

// serviceIdentity returns the suite identity of a single-service process.
func (f *identityFlags) serviceIdentity(ctx context.Context, service string) (*suite.Identity, error) {
	creds, err := f.credentials()
	if err != nil {
		return nil, err
	}
	authn, err := f.authenticator(ctx)
	if err != nil {
		return nil, err
	}
	if creds == nil {
		return &suite.Identity{Insecure: true, Authn: authn}, nil
	}
	if creds.Service() != service {
		return nil, usageError{fmt.Sprintf("the certificate in --tls-cert-file names the %s service, not %s", creds.Service(), service)}
	}
	return &suite.Identity{Authn: authn, Creds: func(string) (*identity.Credentials, error) { return creds, nil }}, nil
}
