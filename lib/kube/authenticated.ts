// A user's groups as the API server completes an authenticated identity, for every question Sealion asks or records
// about a user as the API server would see them (a SubjectAccessReview, an audit event, an impersonation).

export const AUTHENTICATED_GROUP = 'system:authenticated';

/**
 * Everybody is in system:authenticated but the anonymous user and those in system:unauthenticated. A new array.
 */
export function authenticatedGroups(user: { username: string; groups: readonly string[] }): string[] {
  const unauthenticated =
    user.username === 'system:anonymous' || user.groups.includes('system:unauthenticated');
  return user.groups.includes(AUTHENTICATED_GROUP) || unauthenticated
    ? [...user.groups]
    : [...user.groups, AUTHENTICATED_GROUP];
}
