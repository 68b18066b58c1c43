// Command image builds single-binary container images and serves them on
// loopback for the single-node cluster of scripts/realnode.sh.
//
//	image serve ADDR                        serve a registry until killed
//	image push REF BINARY PATH [ARG...]     push an image holding BINARY at PATH
//	                                        (its entrypoint, run with ARGs) and
//	                                        print REF's repository@digest
//
// Images are reproducible: the same binary gives the same digest, so a
// cached image is the cached binary.
package main

import (
	"archive/tar"
	"bytes"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"path"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

func main() {
	log.SetFlags(0)
	log.SetPrefix("image: ")
	if len(os.Args) < 2 {
		log.Fatal("usage: image serve ADDR | image push REF BINARY PATH [ARG...]")
	}
	var err error
	switch os.Args[1] {
	case "serve":
		err = serve(os.Args[2:])
	case "push":
		err = push(os.Args[2:])
	default:
		err = fmt.Errorf("unknown command %q", os.Args[1])
	}
	if err != nil {
		log.Fatal(err)
	}
}

// serve runs an in-memory registry on addr (loopback only: it has no
// authentication).
func serve(args []string) error {
	if len(args) != 1 {
		return errors.New("usage: image serve ADDR")
	}
	host, _, err := net.SplitHostPort(args[0])
	if err != nil {
		return err
	}
	if ip := net.ParseIP(host); ip == nil || !ip.IsLoopback() {
		return fmt.Errorf("refusing to serve an unauthenticated registry on %s: loopback only", host)
	}
	ln, err := net.Listen("tcp", args[0])
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: registry.New(registry.Logger(log.New(io.Discard, "", 0))), ReadHeaderTimeout: 10 * time.Second}
	return srv.Serve(ln)
}

// push builds an image of one layer holding binary at dst (mode 0755, owned
// by root, fixed timestamps) with dst as entrypoint, and pushes it.
func push(args []string) error {
	if len(args) < 3 {
		return errors.New("usage: image push REF BINARY PATH [ARG...]")
	}
	ref, err := name.ParseReference(args[0], name.Insecure)
	if err != nil {
		return err
	}
	bin, err := os.ReadFile(args[1])
	if err != nil {
		return err
	}
	dst := strings.TrimPrefix(path.Clean(args[2]), "/")
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return layerTar(dst, bin) })
	if err != nil {
		return err
	}
	img, err := mutate.AppendLayers(empty.Image, layer)
	if err != nil {
		return err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return err
	}
	cf = cf.DeepCopy()
	// Without os and architecture containerd refuses the image for the
	// platform it runs on.
	cf.OS, cf.Architecture = "linux", "amd64"
	cf.Config.Entrypoint = []string{"/" + dst}
	cf.Config.Cmd = args[3:]
	cf.Config.User = "65532:65532"
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		return err
	}
	if err := remote.Write(ref, img); err != nil {
		return fmt.Errorf("push %s: %w", ref, err)
	}
	d, err := img.Digest()
	if err != nil {
		return err
	}
	fmt.Println(ref.Context().Digest(d.String()).String())
	return nil
}

// layerTar is a tar holding bin at dst with its parent directories.
func layerTar(dst string, bin []byte) (io.ReadCloser, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	epoch := time.Unix(0, 0)
	var dirs []string
	for d := path.Dir(dst); d != "."; d = path.Dir(d) {
		dirs = append([]string{d}, dirs...)
	}
	for _, d := range dirs {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: d + "/", Mode: 0o755, ModTime: epoch}); err != nil {
			return nil, err
		}
	}
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: dst, Mode: 0o755, Size: int64(len(bin)), ModTime: epoch}); err != nil {
		return nil, err
	}
	if _, err := tw.Write(bin); err != nil {
		return nil, err
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return io.NopCloser(&buf), nil
}
