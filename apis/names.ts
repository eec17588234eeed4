// The names Kubernetes validates, as apimachinery checks them (IsDNS1123Label, IsDNS1123Subdomain, IsValidPortName),
// for every layer that reads a name a user wrote before anything is done with it.

/** A DNS-1123 label: up to 63 lower-case letters, digits and inner hyphens (namespaces, Services). */
export const isDNSLabel = (name: string): boolean =>
  name.length <= 63 && /^[a-z0-9]([-a-z0-9]*[a-z0-9])?$/.test(name);

/** A DNS-1123 subdomain: labels joined by dots, up to 253 in all; a label's own length is not checked (pods, nodes). */
export const isDNSSubdomain = (name: string): boolean =>
  name.length <= 253 && /^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$/.test(name);

/** A port's name (IANA_SVC_NAME): up to 15 lower-case letters, digits and single inner hyphens, a letter at least. */
export const isPortName = (name: string): boolean =>
  name.length <= 15 && /^[a-z0-9]+(-[a-z0-9]+)*$/.test(name) && /[a-z]/.test(name);
