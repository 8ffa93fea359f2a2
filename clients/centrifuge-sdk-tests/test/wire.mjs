// The wire the SDK suites run over, from CENTRIFUGE_PROTOCOL: `json` (the
// default, `centrifuge`) or `protobuf` (`centrifuge/build/protobuf`, the
// wire of the Swift, Java and Dart SDKs). scripts/test-centrifuge-sdks
// runs every file once per wire. On Protobuf a publication's `data` is
// bytes: Herald sends the stored JSON byte for byte, and takes JSON bytes.
//
//   import { Centrifuge, PROTOCOL, data, payload } from './wire.mjs';
//   data(ctx.data)          // the JSON value, whichever the wire
//   num(ctx.offset)         // a number (Protobuf: from a Long)
//   sub.publish(payload(v)) // v as this wire sends it
import { Centrifuge as JsonCentrifuge } from 'centrifuge';
import { Centrifuge as ProtobufCentrifuge } from 'centrifuge/build/protobuf';

export const PROTOCOL = process.env.CENTRIFUGE_PROTOCOL ?? 'json';
if (PROTOCOL !== 'json' && PROTOCOL !== 'protobuf') {
  throw new Error(`CENTRIFUGE_PROTOCOL must be json or protobuf, not ${PROTOCOL}`);
}

export const Centrifuge = PROTOCOL === 'protobuf' ? ProtobufCentrifuge : JsonCentrifuge;

/** A publication's data as a JSON value. */
export function data(d) {
  if (PROTOCOL !== 'protobuf') return d;
  return JSON.parse(new TextDecoder().decode(d));
}

/** An offset as a number (the Protobuf build gives 64-bit ones as `Long`). */
export function num(x) {
  return typeof x === 'object' && x !== null ? x.toNumber() : x;
}

/** A JSON value as this wire's SDK publishes it. */
export function payload(v) {
  return PROTOCOL === 'protobuf' ? new TextEncoder().encode(JSON.stringify(v)) : v;
}
