#!/usr/bin/env bash
# Segment an image with one click from any shell: bash + curl, KServe v2 over HTTP.
#
#   scripts/infer_example.sh IMAGE X Y [URL] [MODEL]
#     IMAGE   a JPEG/PNG/TIFF/BMP/WebP file, sent as it is (the server decodes it)
#     X Y     a foreground click, in pixels of the image
#     URL     default $TRITON_URL or localhost:8000;  MODEL default sam2_session
#
# 1. embed: POST the file's bytes as the BYTES input "image_bytes" with Triton's binary-data
#    extension (a JSON header, then the tensor: a 4-byte little-endian length + the bytes);
#    the server answers the image id it computed from the decoded pixels.
# 2. click: a plain JSON request with that id, "points" [1, N, 2] and "labels" [1, N] in
#    original pixels; the answer carries the mask at the original size as COCO RLE
#    ("masks_rle": {"size": image_size, "counts": <string>} decodes with pycocotools), its
#    box and score. Ask for "masks_png" / "masks_bits" with binary outputs instead if wanted.
# Prints the click's JSON answer on stdout.
set -euo pipefail

if [[ $# -lt 3 ]]; then
  sed -n '2,16p' "$0" >&2
  exit 2
fi
image="$1"; x="$2"; y="$3"
url="${4:-${TRITON_URL:-localhost:8000}}"; url="${url%/}"
[[ "$url" == http*://* ]] || url="http://$url"
model="${5:-sam2_session}"

size=$(wc -c < "$image")
header='{"inputs":[{"name":"image_bytes","shape":[1,1],"datatype":"BYTES","parameters":{"binary_data_size":'$((size + 4))'}}],"outputs":[{"name":"image_id"}]}'
length=$(printf '\\x%02x\\x%02x\\x%02x\\x%02x' $((size & 255)) $(((size >> 8) & 255)) \
  $(((size >> 16) & 255)) $(((size >> 24) & 255)))
embed=$({ printf '%s' "$header"; printf "$length"; cat "$image"; } | curl -sS --fail-with-body \
  -X POST "$url/v2/models/$model/infer" -H "Content-Type: application/octet-stream" \
  -H "Inference-Header-Content-Length: ${#header}" --data-binary @-)
image_id=$(printf '%s' "$embed" | grep -o '"data":\["[0-9a-f]*"\]' | cut -d'"' -f4)
[[ -n "$image_id" ]] || { echo "embed failed: $embed" >&2; exit 1; }

curl -sS --fail-with-body -X POST "$url/v2/models/$model/infer" \
  -H 'Content-Type: application/json' -d '{
  "inputs": [
    {"name": "image_id", "shape": [1, 1], "datatype": "BYTES", "data": ["'"$image_id"'"]},
    {"name": "points", "shape": [1, 1, 2], "datatype": "FP32", "data": ['"$x"', '"$y"']},
    {"name": "labels", "shape": [1, 1], "datatype": "INT32", "data": [1]}
  ],
  "outputs": [{"name": "masks_rle"}, {"name": "mask_scores"}, {"name": "mask_boxes"},
              {"name": "image_size"}]
}'
echo
