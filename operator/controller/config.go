package controller

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"

	v1alpha1 "github.com/v0m3/v0m3/operator/api/v1alpha1"
)

const (
	// defaultPort is where the bridge (or a server without a port) listens.
	defaultPort = 8080
	// defaultPath is the MCP endpoint path.
	defaultPath = "/mcp"
)

// port returns the port the server's MCP endpoint listens on in the pod.
func port(s *v1alpha1.MCPServer) int32 {
	if s.Spec.Transport.Port != 0 {
		return s.Spec.Transport.Port
	}
	return defaultPort
}

// path returns the MCP endpoint path.
func path(s *v1alpha1.MCPServer) string {
	if s.Spec.Transport.Path != "" {
		return s.Spec.Transport.Path
	}
	return defaultPath
}

// imageDigest returns the "sha256:..." the image is pinned to. The CRD's
// validation guarantees the image carries one.
func imageDigest(image string) string {
	if i := strings.LastIndex(image, "@"); i >= 0 {
		return image[i+1:]
	}
	return ""
}

// workloadShape is everything, other than the credential version, that
// decides what runs in the pod. Its digest is part of the registered
// endpoint, so a change to the command, arguments, environment, sandbox or
// bridge becomes a new registry config revision just like an image change.
type workloadShape struct {
	Image       string                 `json:"image"`
	Transport   v1alpha1.TransportSpec `json:"transport"`
	Command     []string               `json:"command"`
	Args        []string               `json:"args"`
	Env         []v1alpha1.EnvVar      `json:"env"`
	Credentials *credentialShape       `json:"credentials"`
	Sandbox     v1alpha1.SandboxSpec   `json:"sandbox"`
	BridgeImage string                 `json:"bridgeImage"`
}

// credentialShape names the Secret and how it is exposed, never its data.
type credentialShape struct {
	Secret  string `json:"secret"`
	Key     string `json:"key"`
	EnvName string `json:"envName"`
}

// shapeDigest digests the workload shape of s. encoding/json writes struct
// fields in declaration order and sorts map keys, so the digest is stable.
func shapeDigest(s *v1alpha1.MCPServer, bridgeImage string) (string, error) {
	w := workloadShape{
		Image:     s.Spec.Image,
		Transport: s.Spec.Transport,
		Command:   s.Spec.Command,
		Args:      s.Spec.Args,
		Env:       s.Spec.Env,
		Sandbox:   s.Spec.Sandbox,
	}
	if s.Spec.Transport.Type == v1alpha1.TransportStdio {
		w.BridgeImage = bridgeImage
	}
	if c := s.Spec.Credentials; c != nil {
		w.Credentials = &credentialShape{Secret: c.SecretRef.Name, Key: c.SecretRef.Key, EnvName: c.EnvName}
	}
	return digestJSON(w)
}

// configHash digests the workload shape together with the credential
// version: the value stamped on the pod template, so either a spec change
// or a Secret rotation rolls the Deployment.
func configHash(shape, credentialVersion string) (string, error) {
	return digestJSON(map[string]string{"shape": shape, "credential_version": credentialVersion})
}

func digestJSON(v any) (string, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return "", fmt.Errorf("encode config: %w", err)
	}
	sum := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(sum[:]), nil
}

// credentialVersion is the opaque version recorded in the registry for a
// Secret: its name and resourceVersion. Never derived from its data.
func credentialVersion(secretName, resourceVersion string) string {
	return secretName + "@" + resourceVersion
}

func itoa(n int32) string   { return strconv.FormatInt(int64(n), 10) }
func itoa64(n int64) string { return strconv.FormatInt(n, 10) }
