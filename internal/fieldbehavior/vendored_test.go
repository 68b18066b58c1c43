package fieldbehavior_test

import (
	"os/exec"
	"path/filepath"
	"runtime"
	"testing"

	"google.golang.org/genproto/googleapis/api/annotations"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/types/descriptorpb"
)

// TestVendoredProtoIsTheGoPackages: the vendored
// proto/google/api/field_behavior.proto, as buf compiles it, is the very
// descriptor google.golang.org/genproto/googleapis/api/annotations
// registers (the package the generated contracts import), so the
// annotations the contracts are written with mean what the Go code reads.
func TestVendoredProtoIsTheGoPackages(t *testing.T) {
	if testing.Short() {
		t.Skip("compiling the vendored proto builds buf")
	}
	_, here, _, _ := runtime.Caller(0)
	root := filepath.Join(filepath.Dir(here), "..", "..")
	cmd := exec.Command("go", "tool", "buf", "build", "--exclude-source-info", "--exclude-imports",
		"--path", "proto/google/api/field_behavior.proto", "-o", "-#format=binpb")
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("buf build: %v", err)
	}
	set := &descriptorpb.FileDescriptorSet{}
	if err := proto.Unmarshal(out, set); err != nil {
		t.Fatal(err)
	}
	if len(set.GetFile()) != 1 {
		t.Fatalf("buf built %d files; want the one vendored file", len(set.GetFile()))
	}
	got := set.GetFile()[0]
	got.ProtoReflect().SetUnknown(nil) // buf's own bookkeeping of the image, not part of the file
	want := protodesc.ToFileDescriptorProto(annotations.File_google_api_field_behavior_proto)
	if !proto.Equal(got, want) {
		t.Errorf("vendored field_behavior.proto differs from the registered one:\n got %v\nwant %v", got, want)
	}
}
