# The image `npm run image` builds (CI builds and runs that one), for those who build with a container engine.
# The build stage runs the same builder with --rootfs, so both hold the same files: Debian's runtime libraries for
# Node, Node 24 from the npm registry, the production dependencies and the shipped sources. Nothing else: no shell,
# no npm, no compiler.
FROM debian:bookworm AS build
RUN apt-get update && apt-get install -y --no-install-recommends nodejs npm binutils ca-certificates
WORKDIR /src
COPY package.json package-lock.json ./
RUN npm ci
COPY . .
RUN npm run image -- --rootfs /rootfs

FROM scratch
COPY --from=build /rootfs/ /
USER 65532:65532
WORKDIR /app
ENV PATH=/usr/local/bin:/usr/bin:/bin NODE_ENV=production
ENTRYPOINT ["/usr/local/bin/node", "/app/bin/sealion.js"]
